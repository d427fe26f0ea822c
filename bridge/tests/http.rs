//! The bridge as the filter's HTTP transport sees it: HTTP/1.1 and h2c on one port, strict
//! input validation, `/healthz` following Redis, graceful shutdown.

use crate::common::client::{h2c, http1, req};
use crate::common::server::start;
use crate::common::{Connect, Valkey};
use hyper::{Method, StatusCode};
use std::time::Duration;
use tokio::net::TcpStream;

#[tokio::test]
async fn checks_answer_over_http1_and_h2c() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let body = "rl:k1,2,1,1000,1 rl:k2,5,1,1000,1\nrl:k1,2,1,1000,1\nrl:k1,2,1,1000,1\n";
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<&str> = reply.lines().collect();
    assert_eq!(lines.len(), 3, "{reply}");
    // Three checks on a bucket of two: exactly two admitted, whatever the order.
    let admitted = lines
        .iter()
        .filter(|l| l.split(' ').nth(1).unwrap().starts_with("1,"))
        .count();
    assert_eq!(admitted, 2, "{reply}");
    let (status, reply) = h2c(
        bridge.addr,
        req(Method::POST, "/v1/check", "rl:k3,1,1,1000,1\n"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<&str> = reply.trim_end().split(' ').collect();
    assert_eq!(fields[1], "1,0,1000,0", "{reply}");
}

#[tokio::test]
async fn bad_requests_are_refused_with_a_reason() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    // A bad line fails alone; a body that is no batch at all fails the exchange.
    let body = "rl:k,1,1,1,9\nrl:j,1,1,1,1\n";
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<&str> = reply.lines().collect();
    assert!(
        lines[0].starts_with("? check 1: ") && lines[0].contains("cost"),
        "{reply}"
    );
    assert!(lines[1].contains(" 1,0,"), "{reply}");
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", "")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reply.contains("no check"), "{reply}");
    let huge = "x".repeat(ratelimit_bridge::doors::wire::MAX_BODY + 1);
    let (status, _) = http1(bridge.addr, req(Method::POST, "/v1/check", &huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _) = http1(bridge.addr, req(Method::GET, "/v1/check", "")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = h2c(bridge.addr, req(Method::GET, "/nope", "")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn healthz_follows_redis_and_checks_fail_per_line_when_it_is_gone() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let (status, _) = http1(bridge.addr, req(Method::GET, "/healthz", "")).await;
    assert_eq!(status, StatusCode::OK);
    drop(valkey);
    let (status, _) = http1(bridge.addr, req(Method::GET, "/healthz", "")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, reply) = http1(
        bridge.addr,
        req(Method::POST, "/v1/check", "rl:k,1,1,1,1\n"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.starts_with("! "), "{reply}");
}

#[tokio::test]
async fn shutdown_stops_accepting_and_returns() {
    let valkey = Valkey::start();
    let mut bridge = start(&valkey.url()).await;
    assert_eq!(
        http1(bridge.addr, req(Method::GET, "/healthz", "")).await.0,
        StatusCode::OK
    );
    bridge.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), bridge.task)
        .await
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(bridge.addr).await.is_err());
}

#[tokio::test]
async fn keys_outside_the_prefixes_are_refused_alone_and_left_untouched() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let mut redis = valkey.connection();
    let _: () = redis::cmd("SET")
        .arg("session:42")
        .arg("alice's session")
        .query(&mut redis)
        .unwrap();
    // An attacker reaching the bridge names a key of another application, alone and next
    // to a legitimate rule of the same check.
    let body = "session:42,1,1,1,1\nrl:ok,1,1,1,1 session:42,1,1,1,1\nrl:ok,1,1,1,1\n";
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<&str> = reply.lines().collect();
    assert!(
        lines[0].starts_with("? ") && lines[0].contains("session:42"),
        "{reply}"
    );
    assert!(lines[1].starts_with("? "), "{reply}");
    assert!(
        lines[2].contains(" 1,0,"),
        "the refused check took nothing: {reply}"
    );
    let value: String = redis::cmd("GET")
        .arg("session:42")
        .query(&mut redis)
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg("session:42")
        .query(&mut redis)
        .unwrap();
    assert_eq!((value.as_str(), ttl), ("alice's session", -1));
}
