//! Redis going away and coming back: the bridge is ready again by the time a check comes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::client::{http1, req};
use common::server::start;
use common::Valkey;
use hyper::{Method, StatusCode};
use std::time::Duration;

#[tokio::test]
async fn the_first_check_after_redis_restarts_succeeds() {
    let mut valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let check = || req(Method::POST, "/v1/check", "k,5,1,1000,1\n");
    let (status, reply) = http1(bridge.addr, check()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.contains(" 1,4,"), "{reply}");
    valkey.stop();
    // Checks meanwhile fail (line by line), and leave the connection broken.
    for _ in 0..3 {
        let (_, reply) = http1(bridge.addr, check()).await;
        assert!(reply.starts_with("! "), "{reply}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    valkey.restart();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, reply) = http1(bridge.addr, check()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        reply.contains(" 1,4,"),
        "the first check after the restart: {reply}"
    );
}
