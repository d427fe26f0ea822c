use super::*;
use crate::fakes::{alice_searching as host, EXAMPLE};
use crate::wire::RuleResult;
use crate::worker::settlements;
use ratelimit_protocol::render_reply;

/// What the dispatcher asked of the host, in order.
#[derive(Default)]
struct FakeLink {
    /// Stream messages sent: (exchange id, body).
    sent: Vec<(u32, String)>,
    opened: u32,
    closed: Vec<u32>,
}

impl Link for FakeLink {
    fn stream_send(&mut self, _: u32, id: u32, body: &str) -> Result<(), String> {
        self.sent.push((id, body.to_string()));
        Ok(())
    }
    fn callout(&mut self, _: &ratelimit_config::backend::Backend, _: &str) -> Result<u32, String> {
        Err("no callouts here".into())
    }
    fn redis_call(
        &mut self,
        _: &ratelimit_config::backend::Backend,
        _: &str,
        _: Invoke,
    ) -> Result<u32, String> {
        Err("no redis here".into())
    }
    fn open_stream(&mut self, _: &ratelimit_config::backend::Backend) -> Result<u32, String> {
        self.opened += 1;
        Ok(100 + self.opened)
    }
    fn close_stream(&mut self, token: u32) {
        self.closed.push(token);
    }
    fn post_wake(&mut self) -> bool {
        true
    }
    fn set_tick(&mut self, _: Duration) {}
    fn define_counter(&mut self, _: &str) -> Option<u32> {
        None
    }
    fn add_to_counter(&mut self, _: u32, _: u64) {}
}

/// The example configuration with at most one exchange in flight.
fn config() -> Config {
    let json = EXAMPLE.replace(
        r#""timeout_ms": 25}"#,
        r#""timeout_ms": 25, "max_inflight": 1}"#,
    );
    Config::parse(json.as_bytes()).unwrap()
}

/// The bridge's answer to a stream message: every rule of every check admitted.
fn admit_all(id: u32, body: &str) -> Vec<u8> {
    let results: Vec<CheckResult> = body
        .lines()
        .map(|line| CheckResult::Checked {
            now_ms: 1_000_000,
            rules: vec![
                RuleResult {
                    allowed: true,
                    remaining: 5,
                    full_ms: 1,
                    ..RuleResult::default()
                };
                line.split(' ').count()
            ],
        })
        .collect();
    let mut reply = String::new();
    render_reply(&mut reply, &results);
    wire::stream_message(id, &reply).into_bytes()
}

#[test]
fn checks_arriving_while_an_exchange_is_out_leave_together_when_it_comes_back() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    assert!(d.configure(config(), &host, &mut link).is_empty());
    assert_eq!(link.opened, 1);
    for context in 1..=3 {
        let (go, others) = d.request_headers(context, true, &host, &mut link);
        assert_eq!(go, Go::Wait);
        assert!(others.is_empty());
    }
    assert_eq!(
        link.sent.len(),
        1,
        "one exchange in flight, the other checks wait"
    );
    let (id, body) = link.sent[0].clone();
    let verdicts = d.stream_message(101, &admit_all(id, &body), &host, &mut link);
    assert_eq!(verdicts, vec![(1, Verdict::Resume)]);
    assert_eq!(
        link.sent.len(),
        2,
        "the waiting checks left the moment it came back"
    );
    assert_eq!(link.sent[1].1.lines().count(), 2);
    assert!(
        d.response_headers(1, |_| None, &host, &mut link)
            .fields
            .is_some(),
        "the allowed check's fields"
    );
    let again = d.response_headers(1, |_| None, &host, &mut link);
    assert!(again.fields.is_none(), "taken once");
    let (id, body) = link.sent[1].clone();
    let verdicts = d.stream_message(101, &admit_all(id, &body), &host, &mut link);
    assert_eq!(verdicts, vec![(2, Verdict::Resume), (3, Verdict::Resume)]);
    // A reply on a stream that is not the worker's, or a second reply, settles nothing.
    assert!(d
        .stream_message(999, &admit_all(id, &body), &host, &mut link)
        .is_empty());
    assert!(d
        .stream_message(101, &admit_all(id, &body), &host, &mut link)
        .is_empty());
}

#[test]
fn a_request_that_goes_away_leaves_the_queue_and_its_answer_finds_no_one() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    d.request_headers(2, true, &host, &mut link);
    d.request_gone(2, &host, &mut link);
    d.request_gone(1, &host, &mut link);
    let (id, body) = link.sent[0].clone();
    let verdicts = d.stream_message(101, &admit_all(id, &body), &host, &mut link);
    assert!(verdicts.is_empty(), "{verdicts:?}");
    assert_eq!(
        link.sent.len(),
        1,
        "the departed request's check never left"
    );
}

#[test]
fn a_closed_stream_fails_what_it_carried_and_reopens_with_a_doubling_backoff() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    d.request_headers(2, true, &host, &mut link);
    let verdicts = d.stream_closed(101, 14, &host, &mut link);
    let failed: Vec<u32> = verdicts.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        failed,
        [1, 2],
        "in flight and waiting both fail (failure_mode closed)"
    );
    assert!(verdicts
        .iter()
        .all(|(_, v)| matches!(v, Verdict::Reply(r) if r.status == 503)));
    assert_eq!(
        (link.opened, link.closed.clone()),
        (2, vec![101]),
        "reopened at once"
    );
    // It keeps closing without a reply in between: each reopen waits twice as long as the
    // last (100 ms after the first), on the tick.
    let mut opened_at = Vec::new();
    d.stream_closed(102, 14, &host, &mut link);
    for now in (1_000_000..1_002_000).step_by(10) {
        host.now.set(now);
        let before = link.opened;
        d.tick(&host, &mut link);
        if link.opened > before {
            opened_at.push(now - 1_000_000);
            d.stream_closed(100 + link.opened, 14, &host, &mut link);
        }
    }
    assert_eq!(opened_at, [200, 600, 1400], "{opened_at:?}");
}

#[test]
fn a_new_configuration_keeps_what_is_out_and_answers_it_under_the_old_rules() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    assert!(
        d.configure(config(), &host, &mut link).is_empty(),
        "same cluster: stream kept"
    );
    assert_eq!(link.opened, 1);
    assert_eq!(
        d.generations.len(),
        2,
        "the old configuration lives while its check is out"
    );
    let (id, body) = link.sent[0].clone();
    let verdicts = d.stream_message(101, &admit_all(id, &body), &host, &mut link);
    assert_eq!(verdicts, vec![(1, Verdict::Resume)]);
    d.request_gone(1, &host, &mut link);
    d.tick(&host, &mut link);
    assert_eq!(d.generations.len(), 1, "and goes once nothing holds it");
}

/// One rule per user, metered by a usage header, reserving 100 of 1000 tokens a minute.
fn metered_config() -> Config {
    let json = r#"{"backend": {"cluster": "b", "timeout_ms": 25, "max_inflight": 1},
        "identity": {"user": {"header": "x-user-id"}},
        "rules": [{"name": "tokens", "key": ["user"], "limit": {"requests": 1000, "per": "1m"},
                   "meter": {"header": "x-usage-tokens", "reserve": 100}}]}"#;
    Config::parse(json.as_bytes()).unwrap()
}

/// The bridge's answer to a stream message of settlement lines: each applied.
fn settled(id: u32, body: &str) -> Vec<u8> {
    let results: Vec<CheckResult> = body
        .lines()
        .map(|_| CheckResult::Settled {
            now_ms: 1_000_000,
            rules: vec![RuleResult {
                owed: 20,
                borrowed: 20,
                ..RuleResult::default()
            }],
        })
        .collect();
    let mut reply = String::new();
    render_reply(&mut reply, &results);
    wire::stream_message(id, &reply).into_bytes()
}

/// Request 1 of `metered_config`, admitted on stream 101, its response's usage header
/// saying 220, and the worker woken: its settlement is `link.sent[1]`, out.
fn metered_and_measured(d: &mut Dispatcher, link: &mut FakeLink, host: &impl Proxy) -> bool {
    d.configure(metered_config(), host, link);
    d.request_headers(1, true, host, link);
    let (id, body) = link.sent[0].clone();
    d.stream_message(101, &admit_all(id, &body), host, link);
    let usage = |name: &str| (name == "x-usage-tokens").then(|| b"220".to_vec());
    let start = d.response_headers(1, usage, host, link);
    d.wake(host, link);
    start.read_body
}

#[test]
fn a_metered_response_settles_once_and_its_settlement_goes_again_with_its_id_when_lost() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    let read_body = metered_and_measured(&mut d, &mut link, &host);
    let body = &link.sent[0].1;
    assert_eq!(
        body, "rl:tokens:alice,1000,1,60,100\n",
        "the check reserves 100"
    );
    assert!(!read_body, "the header decided");
    let measured = d.counters.drain();
    assert!(
        measured.contains(&(Counter::MeteredTokens, 220)),
        "{measured:?}"
    );
    let (id, line) = link.sent[1].clone();
    let (mark, rest) = line.split_at(2);
    let (wire_id, rule) = rest.split_once(' ').unwrap();
    // 120 more, owed as deep as need be: the meter's debt is the deepest exact one.
    let debt = ratelimit_config::meter::deepest_debt(&crate::fakes::limit(1000, 1, 60));
    let expected = format!("rl:tokens:alice,1000,1,60,120,{debt}\n");
    assert_eq!((mark, rule), ("= ", expected.as_str()));
    // The reply is lost (the stream closed): on a later tick it goes again, same id.
    d.stream_closed(101, 14, &host, &mut link);
    host.now.set(1_000_000 + settlements::RETRY_MS);
    d.tick(&host, &mut link);
    let (again_id, again) = link.sent.last().cloned().unwrap();
    assert_eq!(again, line, "the same settlement, by the same id {wire_id}");
    d.stream_message(
        link.opened + 100,
        &settled(again_id, &again),
        &host,
        &mut link,
    );
    let counts: Vec<(Counter, u64)> = d.counters.drain();
    let count = |c: Counter| counts.iter().find(|(k, _)| *k == c).map_or(0, |(_, n)| *n);
    assert_eq!(count(Counter::Settled), 1);
    assert_eq!(count(Counter::Debt), 20);
    assert!(d.settlements.is_empty());
    assert_ne!(id, again_id, "another exchange");
}

#[test]
fn a_settlement_given_up_while_out_is_not_counted_as_settled_when_its_answer_comes() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    metered_and_measured(&mut d, &mut link, &host);
    let (out, line) = link.sent[1].clone();
    // While its exchange is out, a long outage's newer settlements push it over the bound.
    for i in 0..settlements::MAX_PENDING {
        let (number, _) = d.settlements.fresh_id();
        d.settlements.add(number, "= x y\n", 1, i as u64);
    }
    d.counters.drain();
    d.stream_message(101, &settled(out, &line), &host, &mut link);
    let counts = d.counters.drain();
    assert!(
        !counts.iter().any(|(c, _)| *c == Counter::Settled),
        "already ended as given up: {counts:?}"
    );
    assert!(counts.contains(&(Counter::Debt, 20)), "applied: {counts:?}");
}

/// A configuration whose one rule reserves what the request body's `max_tokens` asks.
fn reserving_from_the_body() -> Config {
    let json = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
        "identity": {"user": {"header": "x-user-id"}},
        "rules": [{"name": "tokens", "key": ["user"], "limit": {"requests": 1000, "per": "1m"},
                   "meter": {"body": {"usage.total_tokens": 1},
                             "reserve": {"body": ["max_tokens"], "default": 7}}}]}"#;
    Config::parse(json.as_bytes()).unwrap()
}

#[test]
fn a_check_reserving_from_the_body_leaves_once_the_body_has_ended_with_what_it_asked() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(reserving_from_the_body(), &host, &mut link);
    let (go, _) = d.request_headers(1, false, &host, &mut link);
    assert_eq!(go, Go::ReadBody);
    d.request_body(1, br#"{"model": "m", "max_to"#);
    d.request_body(1, br#"kens": 640}"#);
    assert!(
        link.sent.is_empty(),
        "nothing leaves before the body has ended"
    );
    let (go, _) = d.request_body_end(1, &host, &mut link);
    assert_eq!(go, Go::Wait);
    let (_, body) = link.sent[0].clone();
    let batch = ratelimit_protocol::parse_batch(body.as_bytes()).unwrap();
    assert_eq!(batch[0].as_ref().unwrap().rules[0].cost, 640, "{body}");
    // Without a body, the check leaves at once with the default; a second end is nothing.
    let (go, _) = d.request_headers(2, true, &host, &mut link);
    assert_eq!(go, Go::Wait);
    assert_eq!(d.request_body_end(2, &host, &mut link).0, Go::Continue);
    // A request gone while its body comes leaves nothing behind.
    assert_eq!(
        d.request_headers(3, false, &host, &mut link).0,
        Go::ReadBody
    );
    d.request_gone(3, &host, &mut link);
    assert_eq!(d.request_body_end(3, &host, &mut link).0, Go::Continue);
    assert!(d.requests.get(&3).is_none());
}

#[test]
fn an_upstream_answering_before_the_body_is_read_cannot_serve_an_unchecked_request() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(reserving_from_the_body(), &host, &mut link);
    let status = |code: &'static str| move |name: &str| (name == ":status").then(|| code.into());
    // A success that comes while the check waits for the body is refused as unchecked...
    assert_eq!(
        d.request_headers(1, false, &host, &mut link).0,
        Go::ReadBody
    );
    let start = d.response_headers(1, status("200"), &host, &mut link);
    assert_eq!(start.refused.map(|r| r.status), Some(503));
    assert!(start.fields.is_none() && !start.read_body);
    // ...an error passes untouched, and neither leaves a check behind.
    assert_eq!(
        d.request_headers(2, false, &host, &mut link).0,
        Go::ReadBody
    );
    let start = d.response_headers(2, status("413"), &host, &mut link);
    assert!(start.refused.is_none() && start.fields.is_none());
    for id in [1, 2] {
        assert_eq!(d.request_body_end(id, &host, &mut link).0, Go::Continue);
    }
    assert!(link.sent.is_empty() && d.requests.is_empty());
}

#[path = "dispatch_slots_tests.rs"]
mod slots;
