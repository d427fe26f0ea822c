//! The real filter against the real bridge and a real Valkey (live mode), and the refill of
//! the local failure mode's buckets under the harness's virtual clock.

use crate::common::{boot, paused};
use std::time::Duration;
use test_support::{Bridge, Valkey};

/// One rule on `x-user-id`: `requests` per `per`, a bucket of one.
fn on_the_bridge(requests: u32, per: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"backend": {{"cluster": "ratelimit_bridge", "timeout_ms": 1000}},
            "failure_mode": "{failure_mode}", "circuit_breaker": {{"failures": 0}},
            "identity": {{"user": {{"header": "x-user-id"}}}},
            "rules": [{{"name": "r", "key": ["user"],
                        "limit": {{"requests": {requests}, "per": "{per}", "burst": 1}}}}]}}"#
    )
}

#[test]
fn a_live_bridge_and_valkey_deny_then_refill() {
    let valkey = Valkey::start();
    let bridge = Bridge::start(&valkey.url());
    // One token, five per second: back 200 ms after it is spent.
    let mut host = boot(&on_the_bridge(5, "1s", "closed"));
    let alice = [("x-user-id", "alice")];

    let (first, token) = paused(&mut host, "GET", "/", &alice);
    assert_eq!(
        host.forward(token, bridge.addr).unwrap().status(),
        Some(200)
    );
    assert!(host.stream(first).unwrap().resumed(), "{}", host.log_text());

    let (second, token) = paused(&mut host, "GET", "/", &alice);
    host.forward(token, bridge.addr).unwrap();
    let reply = host.stream(second).unwrap().local_reply().unwrap().clone();
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after").as_deref(), Some("1"));
    assert_eq!(reply.header("x-ratelimit-limit").as_deref(), Some("1"));

    // Redis keeps time by its own clock: wait for real, well past the 200 ms.
    host.advance(Duration::from_millis(600)).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let (third, token) = paused(&mut host, "GET", "/", &alice);
    host.forward(token, bridge.addr).unwrap();
    assert!(host.stream(third).unwrap().resumed(), "{}", host.log_text());
}

#[test]
fn local_buckets_refill_with_the_virtual_clock() {
    // Two per minute, a bucket of one: one token every 30 s of virtual time.
    let mut host = boot(&on_the_bridge(2, "1m", "local"));
    let bob = [("x-user-id", "bob")];
    let local_decision = |host: &mut wasmtime_harness::Host| {
        let (id, token) = paused(host, "GET", "/", &bob);
        host.fail_callout(token).unwrap();
        let stream = host.stream(id).unwrap();
        stream
            .local_reply()
            .map(|r| (r.status, r.header("retry-after")))
    };
    assert_eq!(
        local_decision(&mut host),
        None,
        "the first request is admitted"
    );
    assert_eq!(local_decision(&mut host), Some((429, Some("30".into()))));
    host.advance(Duration::from_secs(29)).unwrap();
    assert_eq!(local_decision(&mut host).map(|r| r.0), Some(429));
    host.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(local_decision(&mut host), None, "refilled after 30 s");
}
