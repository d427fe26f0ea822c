//! The redis-call build when Redis cannot decide: down, too slow, an error reply, garbage
//! RESP. Never a trap; the configured failure mode applies to the checks of that call
//! alone, and the circuit breaker counts the failures as it does the bridge's.

use crate::redis::{boot, on_redis, pending, per_user, run_live};
use std::time::Duration;
use test_support::Valkey;
use wasmtime_harness::{Action, Host, Status};

/// A paused request from `user` and its redis call.
fn paused(host: &mut Host, user: &str) -> (u32, u32) {
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    assert_eq!(action, Action::Pause, "{}", host.log_text());
    let tokens = pending(host);
    assert_eq!(tokens.len(), 1, "{}", host.log_text());
    (id, tokens[0])
}

fn assert_failure_mode(host: &Host, id: u32, open: bool) {
    let stream = host.stream(id).unwrap();
    if open {
        assert!(
            stream.resumed() && stream.local_reply().is_none(),
            "{}",
            host.log_text()
        );
    } else {
        let reply = stream
            .local_reply()
            .unwrap_or_else(|| panic!("{}", host.log_text()));
        assert_eq!(reply.status, 503);
        assert!(!stream.resumed());
    }
    assert!(
        host.log_text().contains("check failed"),
        "{}",
        host.log_text()
    );
}

fn mode(open: bool) -> &'static str {
    if open {
        "open"
    } else {
        "closed"
    }
}

/// Replies that are no answer to the script call of a one-rule check.
fn garbage() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", b"".to_vec()),
        ("error", b"-ERR something broke\r\n".to_vec()),
        (
            "crossslot",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec(),
        ),
        ("integer", b":1\r\n".to_vec()),
        ("status", b"+OK\r\n".to_vec()),
        ("nil", b"$-1\r\n".to_vec()),
        (
            "short array",
            b"*3\r\n:1767225600000\r\n:9\r\n:0\r\n".to_vec(),
        ),
        (
            "long array",
            b"*5\r\n:1767225600000\r\n:9\r\n:1\r\n:0\r\n:0\r\n".to_vec(),
        ),
        ("huge length", b"*4294967296000\r\n:1\r\n".to_vec()),
        (
            "bulk strings",
            b"*4\r\n$1\r\n1\r\n$1\r\n9\r\n$1\r\n1\r\n$1\r\n0\r\n".to_vec(),
        ),
        (
            "truncated",
            b"*4\r\n:1767225600000\r\n:9\r\n:1\r\n:".to_vec(),
        ),
        (
            "trailing",
            b"*4\r\n:1767225600000\r\n:9\r\n:1\r\n:0\r\n:7\r\n".to_vec(),
        ),
        (
            "negative",
            b"*4\r\n:1767225600000\r\n:-9\r\n:1\r\n:0\r\n".to_vec(),
        ),
        ("binary", vec![0xff; 100]),
        ("too long", vec![b'*'; 1 << 22]),
    ]
}

#[test]
fn garbage_resp_applies_the_failure_mode_and_the_next_check_is_decided() {
    let valkey = Valkey::start();
    for open in [false, true] {
        for (what, reply) in garbage() {
            let mut host = boot(&on_redis(&per_user("r", 5), mode(open), 1000));
            // A client per case: the cases share the server's buckets.
            let user = format!("{what}-{open}");
            let (id, token) = paused(&mut host, &user);
            host.answer_redis(token, 0, &reply)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_failure_mode(&host, id, open);
            // The worker is fine: the next check goes to Redis and is decided.
            let (next, _) = paused(&mut host, &user);
            run_live(&mut host, &valkey);
            let stream = host.stream(next).unwrap();
            assert!(stream.resumed(), "{what}: {}", host.log_text());
        }
    }
}

#[test]
fn redis_down_applies_the_failure_mode() {
    let mut valkey = Valkey::start();
    valkey.stop();
    for open in [false, true] {
        let mut host = boot(&on_redis(&per_user("r", 5), mode(open), 1000));
        let (id, token) = paused(&mut host, "u");
        assert!(host.forward_redis(token, valkey.addr()).unwrap().is_empty());
        assert_failure_mode(&host, id, open);
        assert!(
            host.log_text().contains("redis call failed"),
            "{}",
            host.log_text()
        );
    }
}

#[test]
fn a_call_unanswered_within_timeout_ms_applies_the_failure_mode() {
    for open in [false, true] {
        let mut host = boot(&on_redis(&per_user("r", 5), mode(open), 25));
        let (id, token) = paused(&mut host, "u");
        host.advance(Duration::from_millis(20)).unwrap();
        assert!(
            host.stream(id).unwrap().local_reply().is_none() && !host.stream(id).unwrap().resumed()
        );
        host.advance(Duration::from_millis(10)).unwrap();
        assert_failure_mode(&host, id, open);
        assert!(
            host.log_text().contains("timeout_ms"),
            "{}",
            host.log_text()
        );
        // The reply arriving late is ignored.
        host.answer_redis(token, 0, b"*4\r\n:1\r\n:4\r\n:1\r\n:0\r\n")
            .unwrap();
    }
}

#[test]
fn repeated_failures_open_the_breaker_and_no_call_is_made_meanwhile() {
    let mut host = boot(&on_redis(&per_user("r", 5), "closed", 1000));
    // Default breaker: five failures open it for one second.
    for _ in 0..5 {
        let (_, token) = paused(&mut host, "u");
        host.answer_redis(token, Status::BrokenConnection.code(), b"")
            .unwrap();
    }
    let before = host.state().redis.calls.len();
    for _ in 0..10 {
        let (id, action) = host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
        assert_eq!(action, Action::Pause);
        assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 503);
    }
    assert_eq!(host.state().redis.calls.len(), before, "no call while open");
    // After its open interval a probe goes out again.
    host.advance(Duration::from_secs(1)).unwrap();
    host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
    assert_eq!(
        host.state().redis.calls.len(),
        before + 1,
        "{}",
        host.log_text()
    );
}
