//! Callout coalescing (`backend.max_inflight`): checks beyond the in-flight limit wait for
//! the next tick and go to the bridge together, one line each, from the root context.

use crate::common::{boot, bridge, paused, NOW_MS};
use std::time::Duration;
use wasmtime_harness::{Action, CallResponse, Host};

fn coalescing(failure_mode: &str) -> Host {
    boot(&format!(
        r#"{{"backend": {{"cluster": "ratelimit_bridge", "timeout_ms": 25, "max_inflight": 1}},
            "failure_mode": "{failure_mode}",
            "identity": {{"user": {{"header": "x-user-id"}}}},
            "rules": [{{"name": "r", "key": ["user"], "limit": {{"requests": 10, "per": "1m"}}}}]}}"#
    ))
}

/// A request that waits: paused, and no callout of its own.
fn waiting(host: &mut Host, user: &str) -> u32 {
    let before = host.callouts().len();
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    assert_eq!(action, Action::Pause);
    assert_eq!(host.callouts().len(), before, "no callout of its own");
    id
}

#[test]
fn checks_past_the_limit_leave_together_and_are_answered_one_by_one() {
    let mut host = coalescing("closed");
    let (a, first) = paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
    let b = waiting(&mut host, "b");
    let c = waiting(&mut host, "c");
    host.advance(Duration::from_millis(1)).unwrap();
    assert_eq!(host.callouts().len(), 2);
    let batch = host.callouts()[1].clone();
    assert_eq!(
        batch.body_text(),
        "rl:r:b,10,1,6000,1\nrl:r:c,10,1,6000,1\n"
    );
    host.answer(
        batch.token,
        bridge(&format!("{NOW_MS} 1,9,6000,0\n{NOW_MS} 0,0,6000,6000")),
    )
    .unwrap();
    assert!(host.stream(b).unwrap().resumed(), "{}", host.log_text());
    let denied = host.stream(c).unwrap().local_reply().unwrap().clone();
    assert_eq!(
        (denied.status, denied.header("retry-after").as_deref()),
        (429, Some("6"))
    );
    // b's response carries its own numbers.
    host.response_headers(b, &[(":status", "200")], true)
        .unwrap();
    let headers = &host.stream(b).unwrap().response_headers;
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == b"x-ratelimit-remaining" && v == b"9"),
        "{headers:?}"
    );
    // The first request's own callout is answered independently.
    host.answer(first, bridge(&format!("{NOW_MS} 1,8,6000,0")))
        .unwrap();
    assert!(host.stream(a).unwrap().resumed());
    // Nothing in flight now: the next check calls out at once again.
    paused(&mut host, "GET", "/", &[("x-user-id", "d")]);
    assert_eq!(host.callouts().len(), 3);
}

#[test]
fn a_request_that_leaves_while_waiting_is_not_sent() {
    let mut host = coalescing("closed");
    paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
    let gone = waiting(&mut host, "gone");
    let stays = waiting(&mut host, "stays");
    host.finish_stream(gone).unwrap();
    host.advance(Duration::from_millis(1)).unwrap();
    let batch = host.callouts().last().unwrap().clone();
    assert_eq!(batch.body_text(), "rl:r:stays,10,1,6000,1\n");
    host.answer(batch.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(stays).unwrap().resumed());
}

#[test]
fn a_failed_batch_applies_the_failure_mode_to_every_member() {
    for (mode, expect) in [("closed", Some(503)), ("open", None)] {
        let mut host = coalescing(mode);
        paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
        let members = [waiting(&mut host, "b"), waiting(&mut host, "c")];
        host.advance(Duration::from_millis(1)).unwrap();
        let batch = host.callouts().last().unwrap().clone();
        host.answer(batch.token, CallResponse::new(200, "garbage"))
            .unwrap();
        for id in members {
            let stream = host.stream(id).unwrap();
            assert_eq!(stream.local_reply().map(|r| r.status), expect, "{mode}");
            assert_eq!(stream.resumed(), expect.is_none(), "{mode}");
        }
    }
}
