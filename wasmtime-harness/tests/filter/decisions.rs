//! Rule matching, the callout the filter sends, and what it does with allowed, denied and
//! mixed replies: resume with rate-limit headers, or a 429.

use crate::common::{boot, bridge, paused, EXAMPLE, NOW_MS};
use wasmtime_harness::{Action, Event, MapType};

#[test]
fn rules_match_on_the_normalized_path_prefix_and_method() {
    let mut host = boot(EXAMPLE);
    let cases = [
        ("GET", "/api/search?q=1", "rl:per-user:alice,100,1,600,1 rl:search-per-ip:192.0.2.10,10,1,6000,1 rl:global,50000,50,1,1\n"),
        ("GET", "/api/x/..//%73earch", "rl:per-user:alice,100,1,600,1 rl:search-per-ip:192.0.2.10,10,1,6000,1 rl:global,50000,50,1,1\n"),
        ("POST", "/api/search", "rl:per-user:alice,100,1,600,1 rl:global,50000,50,1,1\n"),
        ("GET", "/static/x", "rl:global,50000,50,1,1\n"),
    ];
    for (method, path, body) in cases {
        let (id, _) = paused(&mut host, method, path, &[("x-user-id", "alice")]);
        assert_eq!(
            host.callout_of(id).unwrap().body_text(),
            body,
            "{method} {path}"
        );
    }
    // Without x-user-id the per-user rule is skipped, with x-api-key the upload rule joins.
    let (id, _) = paused(&mut host, "PUT", "/api/files", &[("x-api-key", "k1")]);
    assert_eq!(
        host.callout_of(id).unwrap().body_text(),
        "rl:uploads:k1,50,1,72000,5 rl:global,50000,50,1,1\n"
    );
}

#[test]
fn the_callout_is_a_post_to_the_bridge_cluster_with_the_configured_timeout() {
    let mut host = boot(EXAMPLE);
    let (id, _) = paused(&mut host, "GET", "/api/search", &[("x-user-id", "alice")]);
    let callout = host.callout_of(id).unwrap();
    assert_eq!(callout.upstream, "ratelimit_bridge");
    assert_eq!(callout.timeout_ms, 25);
    assert_eq!(callout.header(":method").as_deref(), Some("POST"));
    assert_eq!(callout.header(":path").as_deref(), Some("/v1/check"));
    assert_eq!(
        callout.header(":authority").as_deref(),
        Some("ratelimit_bridge")
    );
    assert_eq!(
        callout.body_text().lines().count(),
        1,
        "one check per request"
    );
}

#[test]
fn allowed_request_resumes_and_gets_rate_limit_headers() {
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/static/x", &[]);
    host.answer(token, bridge(&format!("{NOW_MS} 1,49999,1,0")))
        .unwrap();
    let stream = host.stream(id).unwrap();
    assert!(stream.resumed());
    assert!(stream.local_reply().is_none());
    assert_eq!(
        host.response_headers(id, &[(":status", "200"), ("server", "up")], false)
            .unwrap(),
        Action::Continue
    );
    let headers = &host.stream(id).unwrap().response_headers;
    let value = |n: &str| wasmtime_harness::abi::first(headers, n);
    assert_eq!(value("x-ratelimit-limit").as_deref(), Some("50000"));
    assert_eq!(value("x-ratelimit-remaining").as_deref(), Some("49999"));
    assert_eq!(value("x-ratelimit-reset").as_deref(), Some("1767225601"));
    assert_eq!(value("server").as_deref(), Some("up"));
    let adds = host.stream(id).unwrap().events.iter().filter(|e| {
        matches!(
            e,
            Event::HeaderChange {
                map: MapType::ResponseHeaders,
                op: wasmtime_harness::state::HeaderOp::Add,
                ..
            }
        )
    });
    assert_eq!(adds.count(), 3);
}

#[test]
fn denied_request_gets_a_429_with_retry_after() {
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/static/x", &[]);
    host.answer(token, bridge(&format!("{NOW_MS} 0,0,59400,1500")))
        .unwrap();
    let stream = host.stream(id).unwrap();
    assert!(!stream.resumed());
    let reply = stream.local_reply().expect("a local reply");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after").as_deref(), Some("2"));
    assert_eq!(reply.header("x-ratelimit-limit").as_deref(), Some("50000"));
    assert_eq!(reply.header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(
        reply.header("x-ratelimit-reset").as_deref(),
        Some("1767225660")
    );
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/json")
    );
    assert!(
        reply.body_text().contains("Rate limit exceeded"),
        "{}",
        reply.body_text()
    );
    assert!(
        reply.body_text().contains("50000 requests per second"),
        "{}",
        reply.body_text()
    );
}

#[test]
fn mixed_reply_shows_the_denying_rule() {
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/api/search", &[("x-user-id", "alice")]);
    host.answer(
        token,
        bridge(&format!("{NOW_MS} 1,99,600,0 0,0,6000,4200 1,49999,1,0")),
    )
    .unwrap();
    let reply = host
        .stream(id)
        .unwrap()
        .local_reply()
        .cloned()
        .expect("a 429");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("x-ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(reply.header("retry-after").as_deref(), Some("5"));
    assert!(
        reply.body_text().contains("10 requests per minute"),
        "{}",
        reply.body_text()
    );
}

#[test]
fn allowed_on_several_rules_shows_the_fewest_remaining() {
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/api/search", &[("x-user-id", "alice")]);
    host.answer(
        token,
        bridge(&format!("{NOW_MS} 1,99,600,0 1,3,42000,0 1,49999,1,0")),
    )
    .unwrap();
    host.response_headers(id, &[(":status", "200")], true)
        .unwrap();
    let headers = &host.stream(id).unwrap().response_headers;
    assert_eq!(
        wasmtime_harness::abi::first(headers, "x-ratelimit-limit").as_deref(),
        Some("10")
    );
    assert_eq!(
        wasmtime_harness::abi::first(headers, "x-ratelimit-remaining").as_deref(),
        Some("3")
    );
}

#[test]
fn requests_no_rule_applies_to_pass_without_a_callout() {
    let config = r#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "x-user-id"}},
        "rules": [{"name": "r", "key": ["u"], "match": {"path": "/only", "methods": ["POST"]},
                   "limit": {"requests": 1, "per": "1s"}}]}"#;
    let mut host = boot(config);
    for (method, path) in [("GET", "/only"), ("POST", "/only/not"), ("POST", "/other")] {
        let (id, action) = host.request(method, path, &[("x-user-id", "u")]).unwrap();
        assert_eq!(action, Action::Continue, "{method} {path}");
        assert!(host.callout_of(id).is_none());
    }
    let (_, action) = host
        .request("POST", "/only?x=1", &[("x-user-id", "u")])
        .unwrap();
    assert_eq!(action, Action::Pause);
}
