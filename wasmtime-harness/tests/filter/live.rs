//! Live mode: the real filter's callout sent over TCP to a bridge on loopback. The bridge
//! here is a scripted HTTP/1.1 responder, so the test checks exactly what went on the wire.

use crate::common::{boot, one_rule, paused, NOW_MS};
use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;

/// Accepts one connection, reads one request, answers `reply` (raw), returns the request.
fn responder(reply: Vec<u8>) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let (addr, requests) = test_support::scripted_http(vec![reply]);
    let first = std::thread::spawn(move || requests.join().unwrap().remove(0));
    (addr, first)
}

#[test]
fn a_callout_forwarded_to_a_live_bridge_resumes_the_request() {
    let mut host = boot(&one_rule(r#"{"header": "x-user-id"}"#, "closed"));
    let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "alice")]);
    let body = format!("{NOW_MS} 1,9,6000,0\n");
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (addr, bridge) = responder(reply.into_bytes());
    let answer = host.forward(token, addr).unwrap();
    assert_eq!(answer.status(), Some(200));
    let request = String::from_utf8(bridge.join().unwrap()).unwrap();
    assert!(
        request.starts_with("POST /v1/check HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains("host: ratelimit_bridge\r\n"), "{request}");
    assert!(
        request.ends_with("\r\n\r\nrl:r:alice,10,1,6000,1\n"),
        "{request}"
    );
    assert!(host.stream(id).unwrap().resumed(), "{}", host.log_text());
}

#[test]
fn an_unreachable_or_broken_live_bridge_applies_the_failure_mode() {
    let mut host = boot(&one_rule(r#"{"header": "x-user-id"}"#, "closed"));
    // A port nobody listens on: Envoy's router would answer 503.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
    assert_eq!(host.forward(token, closed).unwrap().status(), Some(503));
    assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 503);
    // A bridge that answers garbage and hangs up.
    let (addr, bridge) = responder(b"garbage\r\n\r\n".to_vec());
    let (id, token) = paused(&mut host, "GET", "/", &[("x-user-id", "u")]);
    assert_eq!(host.forward(token, addr).unwrap().status(), Some(503));
    bridge.join().unwrap();
    assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 503);
}
