use super::*;
use crate::fakes::{alice_searching, example, FakeProxy, FakeRequest, EXAMPLE};

fn host() -> FakeProxy {
    alice_searching(1_000_000)
}

/// A started check, its worker and the callout body.
fn started(config: &Config, host: &FakeProxy) -> (Admission, Worker, String) {
    let mut worker = Worker::new(config);
    let mut check = Admission::default();
    let Start::Ask(body) = check.start(config, &mut worker, host) else {
        panic!("no callout")
    };
    (check, worker, body)
}

fn finish(config: &Config, status: Option<u32>, body: &[u8]) -> (Admission, Verdict) {
    let host = host();
    let (mut check, mut worker, _) = started(config, &host);
    let verdict = conclude(config, &mut worker, &host, &mut check, status, body);
    (check, verdict)
}

/// Ends `check` as the only member of an exchange answered with `status` and `body`.
fn conclude(
    config: &Config,
    worker: &mut Worker,
    host: &FakeProxy,
    check: &mut Admission,
    status: Option<u32>,
    body: &[u8],
) -> Verdict {
    let reply = decode_callout(status, body, &[check.rule_count()]);
    let mut verdicts = conclude_exchange(
        config,
        worker,
        host,
        reply,
        vec![Concluding::Check(config, check)],
    );
    verdicts.pop().flatten().unwrap()
}

/// The rate-limit headers an allowed request's response gets (none: empty).
fn shown_headers(check: &Admission) -> Vec<(&'static str, String)> {
    check
        .response_headers
        .as_ref()
        .map(RateLimitFields::pairs)
        .unwrap_or_default()
}

fn header<'a>(reply: &'a LocalReply, name: &str) -> &'a str {
    reply
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

#[test]
fn one_callout_carries_every_applicable_rule() {
    let (_, _, body) = started(&example("closed"), &host());
    assert_eq!(
        body,
        "rl:per-user:alice,100,1,600,1 rl:search-per-ip:198.51.100.4,10,1,6000,1 rl:global,50000,50,1,1\n"
    );
}

#[test]
fn no_applicable_rule_means_no_callout() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "x-u"}},
            "rules": [{"name": "r", "key": ["u"], "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let mut host = host();
    host.req = FakeRequest::default();
    assert_eq!(
        Admission::default().start(&c, &mut Worker::new(&c), &host),
        Start::Skip
    );
}

#[test]
fn allowed_request_shows_the_rule_with_fewest_tokens_left() {
    let c = example("closed");
    let (check, verdict) = finish(
        &c,
        Some(200),
        b"1700000000000 1,97,1800,0 1,3,42000,0 1,49999,1,0\n",
    );
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(check.outcome, Some(Outcome::Allowed));
    assert_eq!(
        shown_headers(&check),
        vec![
            ("x-ratelimit-limit", "10".to_string()),
            ("x-ratelimit-remaining", "3".to_string()),
            ("x-ratelimit-reset", "1700000042".to_string()),
        ]
    );
}

#[test]
fn remaining_ties_go_to_the_smaller_bucket() {
    let (check, verdict) = finish(
        &example("closed"),
        Some(200),
        b"1700000000000 1,5,1,0 1,5,1,0 1,9,1,0\n",
    );
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&check)[0].1, "10");
}

#[test]
fn a_rule_in_shadow_mode_is_never_shown() {
    let json = EXAMPLE.replace(
        r#"{"name": "search-per-ip", "key": ["ip"],"#,
        r#"{"name": "search-per-ip", "key": ["ip"], "mode": "shadow","#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    // The shadow rule lacked the cost: it has the fewest tokens, yet per-user is shown.
    let (check, verdict) = finish(&c, Some(200), b"1 1,97,1800,0 1,0,60000,6000 1,49999,1,0\n");
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&check)[0].1, "100");
    assert_eq!(shown_headers(&check)[1].1, "97");

    // With every rule in shadow mode the response shows nothing.
    let all_shadow = Config::parse(
        EXAMPLE
            .replace(r#""rules""#, r#""mode": "shadow", "rules""#)
            .as_bytes(),
    )
    .unwrap();
    let (check, verdict) = finish(&all_shadow, Some(200), b"1 1,0,1,5 1,0,1,5 1,0,1,5\n");
    assert_eq!(verdict, Verdict::Resume);
    assert!(
        shown_headers(&check).is_empty(),
        "{:?}",
        shown_headers(&check)
    );
}

#[test]
fn denial_shows_the_denying_rule_with_the_longest_wait() {
    // Alice has tokens left; the IP rule and the global rule deny, the IP one for longer.
    let (check, verdict) = finish(
        &example("closed"),
        Some(200),
        b"1700000000000 1,50,30000,0 0,0,60000,6000 0,0,20,20\n",
    );
    let Verdict::Reply(r) = verdict else {
        panic!("not denied")
    };
    assert_eq!(r.status, 429);
    assert_eq!(header(&r, "x-ratelimit-limit"), "10");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "x-ratelimit-reset"), "1700000060");
    assert_eq!(header(&r, "retry-after"), "6");
    assert!(r
        .body
        .contains("rate limit of 10 requests per minute. Try again in 6 seconds."));
    assert!(shown_headers(&check).is_empty());
    assert_eq!(check.outcome, Some(Outcome::Denied));
}

#[test]
fn headers_on_allowed_responses_can_be_turned_off() {
    let json = EXAMPLE.replace(
        r#""key_prefix": "rl","#,
        r#""key_prefix": "rl", "headers": {"on_allowed": false},"#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let (check, verdict) = finish(&c, Some(200), b"1 1,1,1,0 1,1,1,0 1,1,1,0");
    assert_eq!(verdict, Verdict::Resume);
    assert!(shown_headers(&check).is_empty());
}

const FAILURES: &[(Option<u32>, &[u8])] = &[
    (None, b""),
    (Some(503), b"upstream connect error"),
    (Some(200), b"garbage"),
    (Some(200), b"1700000000000 1,97,1800,0"),
    (Some(200), b"! redis unavailable\n"),
];

#[test]
fn failures_follow_the_failure_mode() {
    for &(status, body) in FAILURES {
        let (check, verdict) = finish(&example("closed"), status, body);
        let Verdict::Reply(r) = verdict else {
            panic!("closed let it through")
        };
        assert_eq!(r.status, 503);
        assert_eq!(header(&r, "retry-after"), "1");
        assert_eq!(check.outcome, Some(Outcome::BackendFailed));

        let (check, verdict) = finish(&example("open"), status, body);
        assert_eq!(verdict, Verdict::Resume);
        assert!(shown_headers(&check).is_empty());
    }
}

#[test]
fn local_failure_mode_enforces_the_share_with_shared_buckets() {
    let json = EXAMPLE.replace(
        r#""failure_mode": "closed""#,
        r#""failure_mode": "local", "local_share": 0.5"#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let mut worker = Worker::new(&c);
    let mut verdicts = Vec::new();
    for _ in 0..8 {
        let mut check = Admission::default();
        let verdict = match check.start(&c, &mut worker, &host) {
            Start::Ask(_) => conclude(&c, &mut worker, &host, &mut check, None, b""),
            Start::Decided(v) => v,
            Start::Skip => panic!("rules apply"),
        };
        verdicts.push(verdict);
    }
    // search-per-ip has a burst of 10: half of it locally.
    let allowed = verdicts.iter().filter(|v| **v == Verdict::Resume).count();
    assert_eq!(allowed, 5);
    let Verdict::Reply(r) = &verdicts[5] else {
        panic!("sixth admitted")
    };
    assert_eq!((r.status, header(r, "x-ratelimit-limit")), (429, "10"));
}

#[test]
fn an_open_breaker_skips_the_callout_until_a_probe_succeeds() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    for _ in 0..c.circuit_breaker.failures {
        let mut check = Admission::default();
        assert!(matches!(check.start(&c, &mut worker, &host), Start::Ask(_)));
        conclude(&c, &mut worker, &host, &mut check, None, b"");
    }
    let mut check = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = check.start(&c, &mut worker, &host) else {
        panic!("breaker not open")
    };
    assert_eq!(r.status, 503);
    assert_eq!(check.outcome, Some(Outcome::ShortCircuited));
    host.now.set(host.now.get() + c.circuit_breaker.open_ms);
    let mut probe = Admission::default();
    assert!(matches!(probe.start(&c, &mut worker, &host), Start::Ask(_)));
    conclude(
        &c,
        &mut worker,
        &host,
        &mut probe,
        Some(200),
        b"1 1,1,1,0 1,1,1,0 1,1,1,0",
    );
    assert!(!worker.breaker.is_open());
}

#[test]
fn extreme_numbers_from_the_bridge_do_not_overflow() {
    let max = u64::MAX;
    let allowed = format!("{max} 1,{max},{max},0 1,{max},{max},0 1,{max},{max},0\n");
    let (check, verdict) = finish(&example("closed"), Some(200), allowed.as_bytes());
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&check)[2].1, (max / 1000 + 1).to_string());
    let denied = format!("{max} 0,0,{max},{max} 1,1,1,0 1,1,1,0\n");
    let (_, verdict) = finish(&example("closed"), Some(200), denied.as_bytes());
    let Verdict::Reply(r) = verdict else {
        panic!("not denied")
    };
    assert_eq!(header(&r, "retry-after"), (max / 1000 + 1).to_string());
}

#[test]
fn a_failed_exchange_counts_once_in_the_breaker_however_many_checks_it_carried() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    let mut checks: Vec<Admission> = (0..2 * c.circuit_breaker.failures)
        .map(|_| started(&c, &host).0)
        .collect();
    let members = checks
        .iter_mut()
        .map(|check| Concluding::Check(&c, check))
        .collect();
    let verdicts = conclude_exchange(&c, &mut worker, &host, Err("reset".into()), members);
    assert!(verdicts
        .iter()
        .all(|v| matches!(v, Some(Verdict::Reply(r)) if r.status == 503)));
    assert!(
        !worker.breaker.is_open(),
        "one failure, not {}",
        checks.len()
    );
    // A line the bridge could not run fails its own check only; a departed member gets
    // no verdict.
    let (mut ok, mut failed) = (started(&c, &host).0, started(&c, &host).0);
    let body = b"1 1,1,1,0 1,1,1,0 1,1,1,0\n! redis down\n1 1,1,1,0 1,1,1,0 1,1,1,0\n";
    let reply = decode_callout(Some(200), body, &[3, 3, 3]);
    let members = vec![
        Concluding::Check(&c, &mut ok),
        Concluding::Check(&c, &mut failed),
        Concluding::Nothing,
    ];
    let verdicts = conclude_exchange(&c, &mut worker, &host, reply, members);
    assert_eq!(verdicts[0], Some(Verdict::Resume));
    assert!(matches!(&verdicts[1], Some(Verdict::Reply(r)) if r.status == 503));
    assert_eq!(verdicts[2], None);
    assert_eq!(
        (ok.outcome, failed.outcome),
        (Some(Outcome::Allowed), Some(Outcome::BackendFailed))
    );
}

#[test]
fn refused_checks_get_the_failure_mode_but_never_open_the_breaker() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    for _ in 0..3 * c.circuit_breaker.failures {
        let mut check = started(&c, &host).0;
        let verdict = conclude(
            &c,
            &mut worker,
            &host,
            &mut check,
            Some(200),
            b"? key outside the allowed prefixes\n",
        );
        assert!(matches!(verdict, Verdict::Reply(r) if r.status == 503));
        assert_eq!(check.outcome, Some(Outcome::Refused));
    }
    assert!(!worker.breaker.is_open());
    let mut check = Admission::default();
    assert!(matches!(check.start(&c, &mut worker, &host), Start::Ask(_)));
}

#[test]
fn a_repeated_identity_header_is_refused_without_a_check() {
    let c = example("open");
    let mut host = host();
    host.req = host.req.twice("x-user-id");
    let mut worker = Worker::new(&c);
    let mut check = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = check.start(&c, &mut worker, &host) else {
        panic!("not refused")
    };
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("x-user-id header appears more than once"),
        "{}",
        r.body
    );
    assert_eq!(check.outcome, Some(Outcome::Rejected));
    // A repeated header no rule reads changes nothing.
    host.req = self::host().req.twice("x-unrelated");
    let mut check = Admission::default();
    assert!(matches!(check.start(&c, &mut worker, &host), Start::Ask(_)));
}

#[test]
fn a_denied_bucket_is_denied_locally_until_it_has_the_cost_again() {
    let config = example("closed");
    let alice = host();
    let host = &alice;
    let (mut check, mut worker, _) = started(&config, host);
    // The IP rule lacks a token for 6 s, the global one for 20 ms (Redis's clock).
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 0,0,20,20\n";
    conclude(&config, &mut worker, host, &mut check, Some(200), reply);
    assert_eq!(worker.deny_cache.len(), 2, "both lacking buckets are known");

    host.now.set(1_000_000 + 1_000);
    let mut again = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = again.start(&config, &mut worker, host) else {
        panic!("asked the bridge again")
    };
    assert_eq!(again.outcome, Some(Outcome::DeniedCached));
    assert_eq!(r.status, 429);
    assert_eq!(
        header(&r, "retry-after"),
        "5",
        "6 s from the check, 1 s later"
    );
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "x-ratelimit-limit"), "10");
    assert_eq!(
        header(&r, "x-ratelimit-reset"),
        "1060",
        "full 60 s after the check"
    );

    // Once the IP bucket holds a token again, the bridge is asked.
    host.now.set(1_000_000 + 6_000);
    let mut later = Admission::default();
    assert!(matches!(
        later.start(&config, &mut worker, host),
        Start::Ask(_)
    ));

    // Another client shares only the global bucket, whose 20 ms are long over.
    let bob = FakeProxy {
        req: FakeRequest::default()
            .with(":method", "GET")
            .with(":path", "/api/search")
            .with("x-user-id", "bob")
            .peer_at("198.51.100.5:1"),
        ..self::host()
    };
    bob.now.set(1_000_000 + 10);
    let mut early = Admission::default();
    assert!(matches!(
        early.start(&config, &mut worker, &bob),
        Start::Decided(_)
    ));
    bob.now.set(1_000_000 + 1_000);
    let mut other = Admission::default();
    assert!(matches!(
        other.start(&config, &mut worker, &bob),
        Start::Ask(_)
    ));
}

#[test]
fn a_deny_cache_of_zero_entries_asks_every_time() {
    let json = EXAMPLE.replace(r#""rules""#, r#""deny_cache_entries": 0, "rules""#);
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let (mut check, mut worker, _) = started(&config, &host);
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 1,1,1,0\n";
    conclude(&config, &mut worker, &host, &mut check, Some(200), reply);
    let mut again = Admission::default();
    assert!(matches!(
        again.start(&config, &mut worker, &host),
        Start::Ask(_)
    ));
}

#[test]
fn a_blocked_client_gets_the_rules_status_and_is_then_refused_locally() {
    let json = EXAMPLE.replace(
        r#""name": "search-per-ip","#,
        r#""name": "search-per-ip", "block": {"after": 3, "within": "1m", "for": "15m", "status": 403},"#,
    );
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let (mut check, mut worker, body) = started(&config, &host);
    assert!(
        body.contains(",3,60000,900000 "),
        "the block travels: {body}"
    );
    // The IP rule answers that the client is blocked for 900 s.
    let reply = b"1700000000000 1,50,30000,0 b,0,60000,900000 1,1,1,0\n";
    let Verdict::Reply(r) = conclude(&config, &mut worker, &host, &mut check, Some(200), reply)
    else {
        panic!("admitted")
    };
    assert_eq!(check.outcome, Some(Outcome::Blocked));
    assert_eq!(r.status, 403);
    assert_eq!(header(&r, "retry-after"), "900");
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["error"], "Blocked");

    host.now.set(1_000_000 + 400);
    let mut again = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = again.start(&config, &mut worker, &host) else {
        panic!("asked the bridge")
    };
    assert_eq!((r.status, again.outcome), (403, Some(Outcome::Blocked)));
    assert_eq!(header(&r, "retry-after"), "900", "the rest of the block");
}

#[test]
fn a_cached_block_is_trusted_for_a_second_so_that_lifting_it_reaches_every_gateway() {
    // Issue 22 row 5: an operator who lifts a block (or deletes the bucket) must see every
    // gateway admit the client within about a second, not when the cached block would end.
    let json = EXAMPLE.replace(
        r#""name": "search-per-ip","#,
        r#""name": "search-per-ip", "block": {"after": 3, "within": "1m", "for": "1h"},"#,
    );
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let (mut check, mut worker, _) = started(&config, &host);
    let reply = b"1700000000000 1,50,30000,0 b,0,60000,3600000 1,1,1,0\n";
    conclude(&config, &mut worker, &host, &mut check, Some(200), reply);
    host.now.set(1_000_000 + 999);
    let mut cached = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = cached.start(&config, &mut worker, &host) else {
        panic!("asked the bridge within the second")
    };
    assert_eq!(cached.outcome, Some(Outcome::Blocked));
    assert_eq!(
        header(&r, "retry-after"),
        "3600",
        "Retry-After still says the block"
    );
    host.now.set(1_000_000 + 1_000);
    let mut asked = Admission::default();
    assert!(
        matches!(asked.start(&config, &mut worker, &host), Start::Ask(_)),
        "a second after asking, the bridge is asked again"
    );
    // The bridge says the block is gone (lifted): admitted, and nothing cached any more.
    let lifted = b"1700000001000 1,50,30000,0 1,0,60000,0 1,1,1,0\n";
    let verdict = conclude(&config, &mut worker, &host, &mut asked, Some(200), lifted);
    assert!(matches!(verdict, Verdict::Resume));
    assert!(matches!(
        Admission::default().start(&config, &mut worker, &host),
        Start::Ask(_)
    ));
}

#[test]
fn a_plain_denial_is_still_cached_for_its_whole_wait() {
    let config = example("closed");
    let host = host();
    let (mut check, mut worker, _) = started(&config, &host);
    // The IP rule lacks the cost for 6 s: exact, so cached that long (no one-second cap).
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 1,1,1,0\n";
    conclude(&config, &mut worker, &host, &mut check, Some(200), reply);
    host.now.set(1_000_000 + 5_999);
    let mut again = Admission::default();
    assert!(matches!(
        again.start(&config, &mut worker, &host),
        Start::Decided(Verdict::Reply(_))
    ));
    assert_eq!(again.outcome, Some(Outcome::DeniedCached));
    host.now.set(1_000_000 + 6_000);
    assert!(matches!(
        Admission::default().start(&config, &mut worker, &host),
        Start::Ask(_)
    ));
}

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
    let (mut check, mut worker, _) = started(config, host);
    conclude(config, &mut worker, host, &mut check, Some(200), allowed);
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
    let mut after = Admission::default();
    let start = after.start(&config, &mut worker, &host);
    assert_eq!(
        start,
        Start::Ask("rl:global,50000,50,1,1\n".into()),
        "used up; a top-up is out"
    );

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

#[test]
fn a_request_lacking_a_required_identity_is_refused_without_a_check_and_counted() {
    let json = EXAMPLE.replace(
        r#""api_key": {"header": "x-api-key"}"#,
        r#""api_key": {"header": "x-api-key", "missing": "deny"}"#,
    );
    assert_ne!(json, EXAMPLE, "the example's api_key identity moved");
    let c = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let mut worker = Worker::new(&c);
    let mut check = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = check.start(&c, &mut worker, &host) else {
        panic!("not refused")
    };
    assert_eq!(r.status, 429);
    assert!(
        !r.headers.iter().any(|(name, _)| *name == "retry-after"),
        "{:?}",
        r.headers
    );
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["error"], "Rate limit key missing");
    assert_eq!(
        body["message"],
        "This request lacks the x-api-key header, which the rate limit \"uploads\" needs to count it."
    );
    assert_eq!(check.outcome, Some(Outcome::Missing));
    let uploads = c.rules.iter().position(|r| r.name == "uploads").unwrap();
    assert_eq!(worker.rule_counts.drain(), [(uploads, Counter::Missing, 1)]);
    // With the key, it is checked as before.
    let keyed = FakeProxy {
        req: self::host().req.with("x-api-key", "k1"),
        ..self::host()
    };
    assert!(matches!(
        Admission::default().start(&c, &mut worker, &keyed),
        Start::Ask(_)
    ));
}
