//! Leases through the check: a hot bucket leased and admitted from the lease, rules from
//! leases and rules sent each keeping their results, leased tokens returned when another
//! rule refuses, and the top-up in the background.

use super::*;
use crate::fakes::{conclude, host, shown_headers, started, FakeProxy, FakeRequest, EXAMPLE};

/// The example with its global rule leasing `tokens` for 2 s, and a request to /other,
/// where only that rule applies.
fn leasing_global(tokens: u64) -> (Config, FakeProxy) {
    let json = EXAMPLE.replace(
        r#""name": "global", "key": [],"#,
        &format!(r#""name": "global", "key": [], "lease": {{"tokens": {tokens}, "ttl": "2s"}},"#),
    );
    let host = FakeProxy {
        req: FakeRequest::default()
            .with(":method", "GET")
            .with(":path", "/other")
            .peer_at("198.51.100.4:1"),
        ..host()
    };
    (Config::parse(json.as_bytes()).unwrap(), host)
}

/// A worker that checked the leasing global rule once (no lease asked: seen once), and the
/// second request, whose check asks for a lease: its line.
fn seen_twice(config: &Config, host: &FakeProxy) -> (Worker, Admission, String) {
    let (mut first, mut worker, body) = started(config, host);
    assert!(!body.contains('+'), "seen once: no lease asked: {body}");
    let allowed = b"1 1,49999,1,0\n";
    conclude(config, &mut worker, host, &mut first, Some(200), allowed);
    let mut second = Admission::default();
    let Start::Ask(body) = second.start(config, &mut worker, host) else {
        panic!("no check")
    };
    (worker, second, body)
}

#[test]
fn a_hot_bucket_is_leased_and_then_admitted_locally_until_the_lease_is_used() {
    let (config, host) = leasing_global(3);
    let (mut worker, mut second, body) = seen_twice(&config, &host);
    assert!(
        body.ends_with(",1+3\n"),
        "seen again: asks for 3 more: {body}"
    );
    let reply = b"1 1,49995,5,0,3\n";
    let verdict = conclude(&config, &mut worker, &host, &mut second, Some(200), reply);
    assert_eq!(verdict, Verdict::Resume);
    for left in ["49994", "49993", "49992"] {
        let mut local = Admission::default();
        let start = local.start(&config, &mut worker, &host);
        assert_eq!(start, Start::Decided(Verdict::Resume));
        assert_eq!(local.outcome, Some(Outcome::Leased));
        assert_eq!(
            shown_headers(&local)[1],
            ("x-ratelimit-remaining", left.into())
        );
    }
    let mut after = Admission::default();
    assert!(
        matches!(after.start(&config, &mut worker, &host), Start::Ask(_)),
        "used up"
    );
    assert!(worker.leases.take_returns().is_empty());
}

/// A worker holding the leases `granted` gives `config`'s rules for `host`'s request: it
/// checked once (`allowed`), then asked for the leases (the ask's line is returned).
fn holding_leases(
    config: &Config,
    host: &FakeProxy,
    allowed: &[u8],
    granted: &[u8],
) -> (Worker, String) {
    let (mut admission, mut worker, _) = started(config, host);
    conclude(
        config,
        &mut worker,
        host,
        &mut admission,
        Some(200),
        allowed,
    );
    let mut ask = Admission::default();
    let Start::Ask(body) = ask.start(config, &mut worker, host) else {
        panic!("no check")
    };
    conclude(config, &mut worker, host, &mut ask, Some(200), granted);
    (worker, body)
}

#[test]
fn rules_from_leases_and_rules_sent_keep_their_own_results_whatever_their_order() {
    // /api/search: per-user and search-per-ip lease, global after them does not.
    let json = EXAMPLE
        .replace(
            r#""name": "per-user", "key": ["user"],"#,
            r#""name": "per-user", "key": ["user"], "lease": {"tokens": 2},"#,
        )
        .replace(
            r#""name": "search-per-ip", "key": ["ip"],"#,
            r#""name": "search-per-ip", "key": ["ip"], "lease": {"tokens": 2},"#,
        );
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let allowed = b"1 1,99,1,0 1,9,1,0 1,49999,1,0\n";
    let granted = b"1 1,4,1,0,2 1,6,1,0,2 1,49996,1,0\n";
    let (mut worker, _) = holding_leases(&config, &host, allowed, granted);
    let mut mixed = Admission::default();
    let start = mixed.start(&config, &mut worker, &host);
    assert_eq!(
        start,
        Start::Ask("rl:global,50000,50,1,1\n".into()),
        "only the rule without a lease is sent"
    );
    let reply = b"1 1,49995,1,0\n";
    let verdict = conclude(&config, &mut worker, &host, &mut mixed, Some(200), reply);
    assert_eq!(verdict, Verdict::Resume);
    // Shown: the fewest tokens left, per-user's lease (4 less this request's 1) with
    // per-user's limit, not search-per-ip's (5 left of 10).
    let shown = shown_headers(&mixed);
    assert_eq!(shown[0], ("x-ratelimit-limit", "100".into()));
    assert_eq!(shown[1], ("x-ratelimit-remaining", "3".into()));
}

#[test]
fn a_request_another_rule_refuses_puts_its_leased_tokens_back() {
    let json = EXAMPLE.replace(
        r#""name": "global", "key": [],"#,
        r#""name": "global", "key": [], "lease": {"tokens": 2},"#,
    );
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let allowed = b"1 1,9,1,0 1,4,1,0 1,49999,1,0\n";
    let granted = b"1 1,8,1,0 1,3,1,0 1,49996,1,0,2\n";
    let (mut worker, ask) = holding_leases(&config, &host, allowed, granted);
    assert!(ask.contains("+2"), "{ask}");
    // The global rule comes from the lease; per-user and per-IP are asked, and deny.
    let mut denied = Admission::default();
    let Start::Ask(body) = denied.start(&config, &mut worker, &host) else {
        panic!("no check")
    };
    assert!(!body.contains("rl:global"), "{body}");
    let reply = b"1 0,0,1,5000 1,2,1,0\n";
    let verdict = conclude(&config, &mut worker, &host, &mut denied, Some(200), reply);
    assert!(matches!(verdict, Verdict::Reply(_)));
    // Both leased tokens are still there for the next requests.
    worker.leases.end_all();
    let back: Vec<u64> = worker
        .leases
        .take_returns()
        .iter()
        .map(|r| r.tokens)
        .collect();
    assert_eq!(back, [2]);
}

#[test]
fn a_lease_running_low_is_topped_up_in_the_background_and_no_request_waits() {
    let (config, host) = leasing_global(4);
    let (mut worker, mut second, _) = seen_twice(&config, &host);
    let verdict = conclude(
        &config,
        &mut worker,
        &host,
        &mut second,
        Some(200),
        b"1 1,49994,6,0,4\n",
    );
    assert_eq!(verdict, Verdict::Resume);
    let admit_locally = |worker: &mut Worker| {
        let mut local = Admission::default();
        let start = local.start(&config, worker, &host);
        assert_eq!(
            (start, local.outcome),
            (Start::Decided(Verdict::Resume), Some(Outcome::Leased))
        );
    };
    // 4 held: 3 and 2 left are not low; at 1 left (below half of 4) one top-up asks for
    // the 3 the lease lacks, and the lease goes on serving meanwhile.
    admit_locally(&mut worker);
    admit_locally(&mut worker);
    assert!(worker.leases.take_top_ups().is_empty());
    admit_locally(&mut worker);
    let top_ups = worker.leases.take_top_ups();
    let [(id, line)] = &top_ups[..] else {
        panic!("one top-up: {top_ups:?}")
    };
    assert_eq!(line, "rl:global,50000,50,1,0+3\n");
    admit_locally(&mut worker);
    assert!(worker.leases.take_top_ups().is_empty(), "one ask at a time");
    // Its answer (alone in an exchange) grants 3: three more requests need no check.
    let reply = decode_callout(Some(200), b"1 1,49987,13,0,3\n", &[1]);
    let verdicts = conclude_exchange(
        &config,
        &mut worker,
        &host,
        reply,
        vec![Concluding::TopUp(*id)],
    );
    assert_eq!(verdicts, [None]);
    for _ in 0..3 {
        admit_locally(&mut worker);
    }
    let top_ups = worker.leases.take_top_ups();
    let [(id, line)] = &top_ups[..] else {
        panic!("low again: one more top-up: {top_ups:?}")
    };
    assert_eq!(line, "rl:global,50000,50,1,0+3\n");
    let after = Admission::default().start(&config, &mut worker, &host);
    let ask = Start::Ask("rl:global,50000,50,1,1\n".into());
    assert_eq!(after, ask, "used up; a top-up is out");

    // A failed top-up grants nothing and lets the next one ask again.
    let failed = vec![Concluding::TopUp(*id)];
    let verdicts = conclude_exchange(&config, &mut worker, &host, Err("reset".into()), failed);
    assert_eq!(verdicts, [None]);
    let (rule, now) = (&config.rules[3], 1_000_000);
    let lacking = worker
        .leases
        .take("rl:global", &rule.limit, 0, rule.lease.unwrap(), now)
        .and_then(|t| t.top_up);
    assert_eq!(
        lacking.map(|(_, n)| n),
        Some(4),
        "asks again, for the whole lease"
    );
    assert!(worker.leases.take_returns().is_empty());
}
