//! What the deny cache decides without the bridge: a bucket known to lack the cost is
//! denied locally until it has it again, and a block is trusted for a second at most.

use super::*;
use crate::fakes::{
    asks, conclude, concluded, example, header, host, started, FakeProxy, FakeRequest, EXAMPLE,
};

#[test]
fn a_denied_bucket_is_denied_locally_until_it_has_the_cost_again() {
    let config = example("closed");
    let alice = host();
    let host = &alice;
    // The IP rule lacks a token for 6 s, the global one for 20 ms (Redis's clock).
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 0,0,20,20\n";
    let (_, mut worker, _) = concluded(&config, host, Some(200), reply);
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
    assert!(asks(&config, &mut worker, host));

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
    assert!(asks(&config, &mut worker, &bob));
}

#[test]
fn a_deny_cache_of_zero_entries_asks_every_time() {
    let json = EXAMPLE.replace(r#""rules""#, r#""deny_cache_entries": 0, "rules""#);
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 1,1,1,0\n";
    let (_, mut worker, _) = concluded(&config, &host, Some(200), reply);
    assert!(asks(&config, &mut worker, &host));
}

#[test]
fn a_blocked_client_gets_the_rules_status_and_is_then_refused_locally() {
    let json = EXAMPLE.replace(
        r#""name": "search-per-ip","#,
        r#""name": "search-per-ip", "block": {"after": 3, "within": "1m", "for": "15m", "status": 403},"#,
    );
    let config = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let (mut admission, mut worker, body) = started(&config, &host);
    assert!(
        body.contains(",3,60000,900000 "),
        "the block travels: {body}"
    );
    // The IP rule answers that the client is blocked for 900 s.
    let reply = b"1700000000000 1,50,30000,0 b,0,60000,900000 1,1,1,0\n";
    let Verdict::Reply(r) = conclude(
        &config,
        &mut worker,
        &host,
        &mut admission,
        Some(200),
        reply,
    ) else {
        panic!("admitted")
    };
    assert_eq!(admission.outcome, Some(Outcome::Blocked));
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
    let reply = b"1700000000000 1,50,30000,0 b,0,60000,3600000 1,1,1,0\n";
    let (_, mut worker, _) = concluded(&config, &host, Some(200), reply);
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
    assert!(asks(&config, &mut worker, &host));
}

#[test]
fn a_plain_denial_is_still_cached_for_its_whole_wait() {
    let config = example("closed");
    let host = host();
    // The IP rule lacks the cost for 6 s: exact, so cached that long (no one-second cap).
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 1,1,1,0\n";
    let (_, mut worker, _) = concluded(&config, &host, Some(200), reply);
    host.now.set(1_000_000 + 5_999);
    let mut again = Admission::default();
    assert!(matches!(
        again.start(&config, &mut worker, &host),
        Start::Decided(Verdict::Reply(_))
    ));
    assert_eq!(again.outcome, Some(Outcome::DeniedCached));
    host.now.set(1_000_000 + 6_000);
    assert!(asks(&config, &mut worker, &host));
}
