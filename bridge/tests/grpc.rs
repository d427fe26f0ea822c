//! The bridge as the filter's default transport sees it: one long-lived gRPC stream
//! (`/ratelimit.v1.Bridge/Check`, h2c), messages answered as their checks finish and paired
//! by exchange id, protocol violations and shutdown ending the stream with a gRPC status.

use crate::common::prefixed;
use crate::common::server::{start, start_with, start_with_token, without_token, RELAXED};
use crate::common::stream::{open, open_as};
use crate::common::Valkey;
use bytes::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

#[tokio::test]
async fn messages_are_answered_with_their_exchange_id_and_a_closed_stream_ends_ok() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let (status, mut s) = open(&bridge).await;
    assert_eq!(status, StatusCode::OK);
    s.send("7\nrl:a,2,1,1000,1\nrl:a,2,1,1000,1\nrl:a,2,1,1000,1\n")
        .await;
    s.send("8\nrl:b,1,1,1000,1 bad key,1,1,1,1\n").await;
    let mut replies = [s.next().await.unwrap(), s.next().await.unwrap()];
    replies.sort();
    let seven: Vec<&str> = replies[0].lines().collect();
    assert_eq!(seven[0], "7");
    // Three checks on a bucket of two, in order: the third is denied.
    let allowed: Vec<&str> = seven[1..]
        .iter()
        .map(|l| &l[l.find(' ').unwrap() + 1..][..1])
        .collect();
    assert_eq!(allowed, ["1", "1", "0"], "{}", replies[0]);
    let eight: Vec<&str> = replies[1].lines().collect();
    assert_eq!(eight[0], "8");
    assert!(eight[1].starts_with("? check 1: "), "{}", replies[1]);
    s.send.take();
    assert_eq!(s.next().await, Err("0".into()));
}

#[tokio::test]
async fn a_message_without_an_exchange_id_ends_the_stream_as_invalid() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let (_, mut s) = open(&bridge).await;
    s.send("g:a,2,1,1000,1\n").await;
    let end = s.next().await.unwrap_err();
    assert!(end.starts_with("3 "), "{end}");
}

#[tokio::test]
async fn shutdown_answers_what_was_sent_then_ends_streams_as_unavailable() {
    let valkey = Valkey::start();
    let mut bridge = start(&valkey.url()).await;
    let (_, mut s) = open(&bridge).await;
    s.send("1\nrl:c,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
    bridge.stop.take().unwrap().send(()).unwrap();
    let end = s.next().await.unwrap_err();
    assert!(end.starts_with("14 "), "{end}");
    tokio::time::timeout(Duration::from_secs(10), bridge.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn plain_http_on_the_stream_path_is_refused() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let io = TokioIo::new(TcpStream::connect(bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let request = Request::post("/ratelimit.v1.Bridge/Check")
        .header("host", "bridge")
        .body(http_body_util::Full::new(Bytes::from_static(b"x")))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn an_idle_stream_outlives_the_header_and_body_deadlines() {
    let valkey = Valkey::start();
    let short = Duration::from_millis(300);
    let bounds = ratelimit_bridge::doors::guards::deadlines::ConnectionBounds {
        header_timeout: short,
        body_timeout: short,
        ..RELAXED
    };
    let bridge = start_with(&valkey.url(), without_token(bounds)).await;
    let (_, mut s) = open(&bridge).await;
    tokio::time::sleep(short * 5).await;
    s.send("1\ng:idle,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
}

#[tokio::test]
async fn a_message_that_stalls_midway_ends_the_stream_at_the_body_deadline() {
    let valkey = Valkey::start();
    let bounds = ratelimit_bridge::doors::guards::deadlines::ConnectionBounds {
        body_timeout: Duration::from_millis(300),
        ..RELAXED
    };
    let bridge = start_with(&valkey.url(), without_token(bounds)).await;
    let (_, mut s) = open(&bridge).await;
    s.send("1\ng:a,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
    // A prefix announcing 100 bytes, then 10 of them.
    let whole = prefixed(&[b'x'; 100]);
    s.send_bytes(whole.slice(..15)).await;
    let end = s.next().await.unwrap_err();
    assert!(end.starts_with("4 "), "{end}");
}

#[tokio::test]
async fn with_a_token_a_stream_must_present_it_or_is_refused_401_before_it_starts() {
    let valkey = Valkey::start();
    let bridge = start_with_token(&valkey.url(), "s3cret-Token").await;
    for wrong in [None, Some("Bearer wrong"), Some("Bearer s3cret-token")] {
        let (status, _) = open_as(&bridge, wrong).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    }
    assert_eq!(crate::common::buckets::script_calls(&valkey), 0);
    let (status, mut s) = open_as(&bridge, Some("Bearer s3cret-Token")).await;
    assert_eq!(status, StatusCode::OK);
    s.send("1\ng:auth,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
}
