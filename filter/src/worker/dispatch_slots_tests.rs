//! The dispatcher's in-flight slots: taken with a check, renewed on the tick while the
//! request lives, released when it ends (and only after its check's answer when it ends
//! first), never held by a denied check.

use super::*;

/// One rule per user: at most 2 requests in flight, slots living 3 s.
fn in_flight_config() -> Config {
    let json = r#"{"backend": {"cluster": "b", "timeout_ms": 25, "max_inflight": 1},
        "identity": {"user": {"header": "x-user-id"}},
        "rules": [{"name": "streams", "key": ["user"], "in_flight": {"max": 2, "ttl": "3s"}}]}"#;
    Config::parse(json.as_bytes()).unwrap()
}

/// The bridge's answer to a stream message: each line's one rule allowed or not.
fn answer(id: u32, body: &str, allowed: bool) -> Vec<u8> {
    let results: Vec<CheckResult> = body
        .lines()
        .map(|_| CheckResult::Checked {
            now_ms: 1_000_000,
            rules: vec![RuleResult {
                allowed,
                remaining: 1,
                wait_ms: if allowed { 0 } else { 1_000 },
                ..RuleResult::default()
            }],
        })
        .collect();
    let mut reply = String::new();
    render_reply(&mut reply, &results);
    wire::stream_message(id, &reply).into_bytes()
}

fn count(d: &mut Dispatcher, counter: Counter) -> u64 {
    let counts = d.counters.drain();
    counts
        .iter()
        .find(|(k, _)| *k == counter)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn a_request_holds_its_slot_while_it_lives_renewing_it_and_releases_it_at_its_end() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(in_flight_config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    let (id, check) = link.sent[0].clone();
    let (rule, slot_id) = check.trim_end().rsplit_once('|').unwrap();
    assert_eq!(rule, "rl:streams:alice,2,1,1500,1|3000");
    let verdicts = d.stream_message(101, &answer(id, &check, true), &host, &mut link);
    assert_eq!(verdicts, vec![(1, Verdict::Resume)]);
    assert_eq!(count(&mut d, Counter::SlotsTaken), 1);
    // A third of its life later, the tick renews it: a settlement of nothing.
    host.now.set(1_000_999);
    d.tick(&host, &mut link);
    assert_eq!(link.sent.len(), 1, "not due yet");
    host.now.set(1_001_000);
    d.tick(&host, &mut link);
    let (renewal_id, renewal) = link.sent[1].clone();
    assert_eq!(
        renewal,
        format!("= {slot_id} rl:streams:alice,2,1,1500,0,0|3000|{slot_id}\n")
    );
    d.stream_message(101, &answer(renewal_id, &renewal, true), &host, &mut link);
    // Its end releases it, by a lease return of its slot.
    d.request_gone(1, &host, &mut link);
    d.wake(&host, &mut link);
    let (release_id, release) = link.sent[2].clone();
    assert_eq!(release, format!("+ {rule}|{slot_id}\n"));
    assert!(!d.settlements.is_empty(), "held until applied");
    d.stream_message(101, &answer(release_id, &release, true), &host, &mut link);
    assert!(d.settlements.is_empty());
    assert_eq!(count(&mut d, Counter::SlotsReleased), 1);
    host.now.set(1_010_000);
    d.tick(&host, &mut link);
    assert_eq!(link.sent.len(), 3, "nothing more to renew");
}

#[test]
fn a_release_lost_with_its_exchange_goes_again() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(in_flight_config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    let (id, check) = link.sent[0].clone();
    d.stream_message(101, &answer(id, &check, true), &host, &mut link);
    d.request_gone(1, &host, &mut link);
    d.wake(&host, &mut link);
    let release = link.sent[1].1.clone();
    d.stream_closed(101, 14, &host, &mut link);
    host.now.set(1_000_000 + settlements::RETRY_MS);
    d.tick(&host, &mut link);
    assert_eq!(link.sent.last().map(|s| &s.1), Some(&release));
}

#[test]
fn a_request_gone_while_its_check_is_out_releases_its_slot_only_after_the_answer() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(in_flight_config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    d.request_headers(2, true, &host, &mut link);
    // Request 1's check is out, request 2's waits: both go away.
    d.request_gone(1, &host, &mut link);
    d.request_gone(2, &host, &mut link);
    d.wake(&host, &mut link);
    assert_eq!(link.sent.len(), 1, "no release may overtake the take");
    let (id, check) = link.sent[0].clone();
    assert!(d
        .stream_message(101, &answer(id, &check, true), &host, &mut link)
        .is_empty());
    d.wake(&host, &mut link);
    assert_eq!(link.sent.len(), 2, "request 2's check never left");
    assert!(
        link.sent[1].1.starts_with("+ rl:streams:alice,"),
        "{:?}",
        link.sent[1]
    );
}

#[test]
fn a_denied_check_holds_no_slot() {
    let (mut d, mut link, host) = (Dispatcher::default(), FakeLink::default(), host(1_000_000));
    d.configure(in_flight_config(), &host, &mut link);
    d.request_headers(1, true, &host, &mut link);
    let (id, check) = link.sent[0].clone();
    let verdicts = d.stream_message(101, &answer(id, &check, false), &host, &mut link);
    assert!(
        matches!(verdicts[..], [(1, Verdict::Reply(_))]),
        "{verdicts:?}"
    );
    d.request_gone(1, &host, &mut link);
    host.now.set(1_005_000);
    d.tick(&host, &mut link);
    assert_eq!(link.sent.len(), 1, "no renewal, no release");
    assert_eq!(count(&mut d, Counter::SlotsTaken), 0);
}
