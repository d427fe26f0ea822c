//! The default transport: one gRPC stream per worker, opened by the root at configuration;
//! replies in any order, timeouts, a stream that closes under its checks, garbage.

use crate::common::{wasm, NOW_MS};
use std::time::Duration;
use wasmtime_harness::{Action, Host, HostState};

const CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25, "max_inflight": 2},
    "failure_mode": "closed",
    "identity": {"user": {"header": "x-user-id"}},
    "rules": [{"name": "r", "key": ["user"], "limit": {"requests": 10, "per": "1m"}}]}"#;

fn boot(config: &str) -> Host {
    let (host, accepted) = Host::boot(wasm(), config).unwrap();
    assert!(accepted, "{}", host.log_text());
    host
}

fn ask(host: &mut Host, user: &str) -> u32 {
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    assert_eq!(action, Action::Pause, "{}", host.log_text());
    id
}

fn reply(host: &mut Host, token: u32, id: u32, lines: &str) {
    host.grpc_message(token, format!("{id}\n{lines}").as_bytes())
        .unwrap();
}

fn status(host: &Host, id: u32) -> Option<u32> {
    host.stream(id).unwrap().local_reply().map(|r| r.status)
}

#[test]
fn the_root_opens_one_stream_to_the_bridge_at_configuration() {
    let host = boot(CONFIG);
    let streams = host.grpc_streams();
    assert_eq!(streams.len(), 1);
    let s = &streams[0];
    assert_eq!(
        (s.upstream.as_str(), s.service.as_str(), s.method.as_str()),
        ("ratelimit_bridge", "ratelimit.v1.Bridge", "Check")
    );
    assert!(host.callouts().is_empty());
}

#[test]
fn the_backend_token_travels_as_bearer_on_the_stream_and_on_callouts() {
    let with_token = CONFIG.replace(
        r#""cluster": "ratelimit_bridge","#,
        r#""cluster": "ratelimit_bridge", "token": "t0k3n","#,
    );
    let host = boot(&with_token);
    let metadata = &host.grpc_streams()[0].initial_metadata;
    assert!(
        metadata
            .iter()
            .any(|(k, v)| k.as_slice() == b"authorization" && v.as_slice() == b"Bearer t0k3n"),
        "{metadata:?}"
    );
    assert!(boot(CONFIG).grpc_streams()[0].initial_metadata.is_empty());
    let http = r#""transport": "http", "max_inflight": 0"#;
    let mut host = boot(&with_token.replace(r#""max_inflight": 2"#, http));
    let (_, token) = crate::common::paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
    let callout = host.callouts().iter().find(|c| c.token == token).unwrap();
    assert_eq!(
        callout.header("authorization").as_deref(),
        Some("Bearer t0k3n")
    );
    assert!(!host.log_text().contains("t0k3n"), "{}", host.log_text());
}

#[test]
fn replies_pair_with_their_exchange_in_any_order() {
    let mut host = boot(CONFIG);
    let token = host.grpc_streams()[0].token;
    let a = ask(&mut host, "a");
    let b = ask(&mut host, "b");
    reply(&mut host, token, 2, &format!("{NOW_MS} 0,0,6000,6000\n"));
    assert_eq!(status(&host, b), Some(429));
    assert!(!host.stream(a).unwrap().resumed());
    reply(&mut host, token, 1, &format!("{NOW_MS} 1,9,6000,0\n"));
    assert!(host.stream(a).unwrap().resumed());
    // A second (or unknown) reply for an exchange is ignored, without a trap.
    reply(&mut host, token, 1, &format!("{NOW_MS} 0,0,6000,6000\n"));
    reply(&mut host, token, 77, &format!("{NOW_MS} 0,0,6000,6000\n"));
    host.grpc_message(token, b"no id line").unwrap();
    assert!(host.stream(a).unwrap().resumed());
}

#[test]
fn an_unanswered_exchange_times_out_and_its_late_reply_is_ignored() {
    let mut host = boot(CONFIG);
    let token = host.grpc_streams()[0].token;
    let a = ask(&mut host, "a");
    host.advance(Duration::from_millis(20)).unwrap();
    assert_eq!(status(&host, a), None, "not yet");
    host.advance(Duration::from_millis(15)).unwrap();
    assert_eq!(status(&host, a), Some(503), "{}", host.log_text());
    reply(&mut host, token, 1, &format!("{NOW_MS} 1,9,6000,0\n"));
    assert!(!host.stream(a).unwrap().resumed());
    // The slot is free again: the next check goes out at once.
    ask(&mut host, "b");
    assert_eq!(host.grpc_streams()[0].messages.len(), 2);
}

#[test]
fn garbage_replies_apply_the_failure_mode_to_their_exchange() {
    let mut host = boot(CONFIG);
    let token = host.grpc_streams()[0].token;
    let a = ask(&mut host, "a");
    reply(&mut host, token, 1, "<html>502</html>\n");
    assert_eq!(status(&host, a), Some(503));
}

#[test]
fn a_stream_that_closes_fails_its_checks_is_closed_and_reopened() {
    let mut host = boot(CONFIG);
    let token = host.grpc_streams()[0].token;
    let a = ask(&mut host, "a");
    let b = ask(&mut host, "b");
    let waiting = ask(&mut host, "c");
    host.grpc_remote_close(token, 14, "bridge shutting down")
        .unwrap();
    for id in [a, b, waiting] {
        assert_eq!(status(&host, id), Some(503), "{}", host.log_text());
    }
    let streams = host.grpc_streams();
    assert!(!streams[0].leaked(), "the dead token is closed");
    assert_eq!(streams.len(), 2, "reopened at once");
    // Closing again before any answer backs off: the next stream opens on a later tick.
    let fresh = streams[1].token;
    host.grpc_remote_close(fresh, 14, "").unwrap();
    assert_eq!(host.grpc_streams().len(), 2);
    host.advance(Duration::from_millis(150)).unwrap();
    assert_eq!(
        host.grpc_streams().len(),
        2,
        "the backoff doubled to 200 ms"
    );
    host.advance(Duration::from_millis(60)).unwrap();
    assert_eq!(host.grpc_streams().len(), 3, "{}", host.log_text());
    let third = host.grpc_streams()[2].token;
    let d = ask(&mut host, "d");
    let sent = host.grpc_streams()[2].messages_text();
    let id: u32 = sent[0].split('\n').next().unwrap().parse().unwrap();
    reply(&mut host, third, id, &format!("{NOW_MS} 1,9,6000,0\n"));
    assert!(host.stream(d).unwrap().resumed(), "{}", host.log_text());
}

#[test]
fn an_unknown_cluster_applies_the_failure_mode_without_trapping() {
    let state = HostState {
        clusters: Some(vec!["some_other_cluster".into()]),
        ..HostState::default()
    };
    let mut host = Host::with_state(wasm(), state).unwrap();
    assert!(host.start(b"").unwrap());
    assert!(host.configure(CONFIG.as_bytes()).unwrap());
    let a = ask(&mut host, "a");
    assert_eq!(status(&host, a), Some(503));
    assert!(
        host.log_text().contains("cannot open a gRPC stream"),
        "{}",
        host.log_text()
    );
}
