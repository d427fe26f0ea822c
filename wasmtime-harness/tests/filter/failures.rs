//! When the bridge cannot decide: error statuses, timeouts, resets, garbage and truncated
//! replies, dispatch refused. Never a trap; the configured failure mode applies.

use crate::common::{boot, bridge, http, one_rule, paused, wasm, NOW_MS};
use wasmtime_harness::{Action, CallResponse, Host, HostState};

fn closed() -> Host {
    boot(&one_rule(r#"{"header": "x-user-id"}"#, "closed"))
}

fn open() -> Host {
    boot(&one_rule(r#"{"header": "x-user-id"}"#, "open"))
}

/// Asserts the failure mode's outcome for stream `id`.
fn assert_failure_mode(host: &Host, id: u32, open: bool) {
    let stream = host.stream(id).unwrap();
    if open {
        assert!(stream.resumed(), "open: resumed\n{}", host.log_text());
        assert!(stream.local_reply().is_none());
    } else {
        let reply = stream
            .local_reply()
            .unwrap_or_else(|| panic!("closed: a 503\n{}", host.log_text()));
        assert_eq!(reply.status, 503);
        assert_eq!(reply.header("retry-after").as_deref(), Some("1"));
        assert!(!stream.resumed());
    }
    assert!(
        host.log_text().contains("check failed"),
        "{}",
        host.log_text()
    );
}

fn bad_replies() -> Vec<(&'static str, CallResponse)> {
    vec![
        ("500", CallResponse::new(500, "boom")),
        (
            "503 with a valid body",
            CallResponse::new(503, format!("{NOW_MS} 1,9,1,0\n")),
        ),
        (
            "html",
            CallResponse::new(200, "<html>502 Bad Gateway</html>"),
        ),
        ("empty", CallResponse::new(200, "")),
        ("truncated", CallResponse::new(200, format!("{NOW_MS} 1,9"))),
        (
            "too many rules",
            bridge(&format!("{NOW_MS} 1,9,1,0 1,9,1,0")),
        ),
        (
            "extra line",
            CallResponse::new(200, format!("{NOW_MS} 1,9,1,0\n{NOW_MS} 1,9,1,0\n")),
        ),
        (
            "non-UTF-8",
            CallResponse::new(200, b"\xff\xfe 1,9,1,0\n".to_vec()),
        ),
        ("huge", CallResponse::new(200, vec![b'1'; 70_000])),
        ("bridge says failed", bridge("! redis unavailable")),
        (
            "no :status",
            CallResponse {
                headers: Vec::new(),
                body: b"x".to_vec(),
                trailers: Vec::new(),
            },
        ),
    ]
}

#[test]
fn bad_replies_apply_the_failure_mode_without_trapping() {
    for open_mode in [false, true] {
        for (what, reply) in bad_replies() {
            // A fresh VM per case: the filter's circuit breaker opens after repeated failures.
            let mut host = if open_mode { open() } else { closed() };
            let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
            host.answer(token, reply)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_failure_mode(&host, id, open_mode);
        }
    }
}

#[test]
fn timeouts_apply_the_failure_mode() {
    for open_mode in [false, true] {
        let mut host = if open_mode { open() } else { closed() };
        let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
        // 24 ms: still waiting; 25 ms: Envoy's router answers 504.
        host.advance(std::time::Duration::from_millis(24)).unwrap();
        assert!(
            host.stream(id).unwrap().events.len() == 1,
            "only the dispatch so far"
        );
        host.advance(std::time::Duration::from_millis(1)).unwrap();
        let callout = host.callout_of(id).unwrap();
        assert_eq!(callout.state, wasmtime_harness::CalloutState::TimedOut);
        assert_failure_mode(&host, id, open_mode);
        assert!(host.log_text().contains("HTTP 504"), "{}", host.log_text());
        let _ = token;
    }
}

#[test]
fn a_refused_dispatch_applies_the_failure_mode_at_once() {
    for (mode, expect) in [("closed", Action::Pause), ("open", Action::Continue)] {
        let state = HostState {
            clusters: Some(vec!["some_other_cluster".into()]),
            ..HostState::default()
        };
        let mut host = Host::with_state(wasm(), state).unwrap();
        assert!(host.start(b"").unwrap());
        assert!(host
            .configure(http(&one_rule(r#"{"header": "x-user-id"}"#, mode)).as_bytes())
            .unwrap());
        let (id, action) = host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
        assert_eq!(action, expect, "{mode}");
        assert!(
            host.log_text().contains("dispatch failed"),
            "{}",
            host.log_text()
        );
        let reply = host.stream(id).unwrap().local_reply().map(|r| r.status);
        assert_eq!(reply, (mode == "closed").then_some(503));
    }
}

/// Envoy calls back a reset callout with zero headers and no reply header map at all
/// (reading it answers BadArgument, on which the SDK panics): the glue must not look.
#[test]
fn a_reset_callout_applies_the_failure_mode_without_trapping() {
    for open_mode in [false, true] {
        let mut host = if open_mode { open() } else { closed() };
        let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
        host.fail_callout(token)
            .unwrap_or_else(|e| panic!("reset callout: {e}"));
        assert_failure_mode(&host, id, open_mode);
    }
}

#[test]
fn an_open_breaker_makes_no_callout_until_its_probe() {
    // Default breaker: five failures open it for one second.
    let mut host = closed();
    for _ in 0..5 {
        let (_, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
        host.fail_callout(token).unwrap();
    }
    let before = host.callouts().len();
    for _ in 0..20 {
        let (id, action) = host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
        assert_eq!(action, Action::Pause, "answered locally");
        assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 503);
    }
    assert_eq!(
        host.callouts().len(),
        before,
        "no callout while the breaker is open"
    );
    host.advance(std::time::Duration::from_secs(1)).unwrap();
    let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
    host.answer(token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(id).unwrap().resumed(), "the probe went through");
    let (_, action) = host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
    assert_eq!(action, Action::Pause);
    assert_eq!(
        host.callouts().len(),
        before + 2,
        "closed again: calling out"
    );
}
