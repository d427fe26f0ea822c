//! Clients that open connections and stall: every slot they hold is given back within the
//! header or body deadline, a body announced too large is refused before it is read, and
//! the connection cap holds without starving the checks that follow. Deadlines here are
//! short for the limit under test and long for the others, and every wait for the bridge
//! is several seconds longer than the deadline it waits for.

use crate::common::client::{h2c, http1, req};
use crate::common::server::{start_with, without_token, RELAXED};
use crate::common::Valkey;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratelimit_bridge::doors::guards::deadlines::ConnectionBounds;
use ratelimit_bridge::doors::server::Config;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How much later than its deadline the bridge may act, for a loaded machine.
const SLACK: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);

fn bounded(header_timeout: Duration, body_timeout: Duration, max_connections: u32) -> Config {
    without_token(ConnectionBounds {
        header_timeout,
        body_timeout,
        max_connections,
        ..RELAXED
    })
}

async fn connect(addr: SocketAddr, send: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(send).await.unwrap();
    conn
}

/// What the bridge sent until it closed the connection; `None` if it is still open after
/// `within`.
async fn until_closed(conn: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status line of the bridge's HTTP/1.1 answer, if one comes within `within`.
async fn status_line(conn: &mut TcpStream, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    let text = String::from_utf8_lossy(&got);
    text.lines().next().map(str::to_string)
}

type Chunks = BoxStream<'static, Result<Frame<Bytes>, Infallible>>;

/// A `POST /v1/check` whose body the test sends piece by piece; it never ends.
fn streamed(content_length: Option<u64>) -> (Request<StreamBody<Chunks>>, mpsc::Sender<Bytes>) {
    let (send, chunks) = mpsc::channel::<Bytes>(4);
    let stream = futures_util::stream::unfold(chunks, |mut chunks| async move {
        let chunk = chunks.recv().await?;
        Some((Ok(Frame::data(chunk)), chunks))
    });
    let mut request = Request::post("http://bridge/v1/check").header("host", "bridge");
    if let Some(len) = content_length {
        request = request.header("content-length", len);
    }
    let body = StreamBody::new(Box::pin(stream) as Chunks);
    (request.body(body).unwrap(), send)
}

const STALLED_CHECK: &[u8] =
    b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ncontent-length: 10\r\n\r\nrl:";
const PARTIAL_HEAD: &[u8] = b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ncontent-le";
const H2_PREFACE_AND_SETTINGS: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

#[tokio::test]
async fn connections_that_never_complete_their_headers_are_closed_after_the_deadline() {
    let valkey = Valkey::start();
    let header_timeout = Duration::from_millis(500);
    let bridge = start_with(&valkey.url(), bounded(header_timeout, LONG, 64)).await;
    let mut stalled = [
        connect(bridge.addr, PARTIAL_HEAD).await,
        connect(bridge.addr, b"").await, // not even the protocol
        connect(bridge.addr, b"PRI * HTTP/2.0\r\n").await, // half the HTTP/2 preface
        connect(bridge.addr, H2_PREFACE_AND_SETTINGS).await, // then no stream
    ];
    let started = Instant::now();
    for (i, conn) in stalled.iter_mut().enumerate() {
        let closed = until_closed(conn, header_timeout + SLACK).await;
        assert!(
            closed.is_some(),
            "connection {i} still open after {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn idle_connections_are_closed_between_requests_over_http1_and_h2() {
    let valkey = Valkey::start();
    let header_timeout = Duration::from_millis(500);
    let bridge = start_with(&valkey.url(), bounded(header_timeout, LONG, 64)).await;
    let mut h1 = connect(
        bridge.addr,
        b"GET /healthz HTTP/1.1\r\nhost: bridge\r\n\r\n",
    )
    .await;
    let answer = until_closed(&mut h1, header_timeout + SLACK).await;
    let answer = String::from_utf8(answer.expect("closed once idle")).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let io = TokioIo::new(TcpStream::connect(bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let response = sender
        .send_request(req(Method::GET, "http://bridge/healthz", ""))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    tokio::time::timeout(header_timeout + SLACK, conn)
        .await
        .expect("the bridge closes an HTTP/2 connection without streams")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_body_announced_too_large_is_refused_before_it_is_sent() {
    let valkey = Valkey::start();
    let bridge = start_with(&valkey.url(), bounded(LONG, LONG, 64)).await;
    let mut conn = connect(
        bridge.addr,
        b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ncontent-length: 10000000000\r\n\r\n",
    )
    .await;
    let status = status_line(&mut conn, SLACK).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));

    let (request, _body) = streamed(Some(10_000_000_000));
    let (status, reply) = tokio::time::timeout(SLACK, h2c(bridge.addr, request))
        .await
        .expect("an answer before any body");
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{reply}");
}

#[tokio::test]
async fn only_a_body_past_the_bound_is_too_large_a_broken_one_is_a_bad_request() {
    let valkey = Valkey::start();
    let bridge = start_with(&valkey.url(), bounded(LONG, LONG, 64)).await;
    // Chunked, so no length is announced: the bound is found while reading.
    let chunk = "x".repeat(64 * 1024);
    let mut big =
        b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..5 {
        big.extend(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
    }
    let mut conn = connect(bridge.addr, &big).await;
    let status = status_line(&mut conn, SLACK).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    // A chunk size that is not hex: the body is broken, not large.
    let mut conn = connect(
        bridge.addr,
        b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nrl:k\r\n",
    )
    .await;
    let status = status_line(&mut conn, SLACK).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 400 Bad Request"));
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    let valkey = Valkey::start();
    let body_timeout = Duration::from_millis(500);
    let bridge = start_with(&valkey.url(), bounded(LONG, body_timeout, 64)).await;
    let mut conn = connect(
        bridge.addr,
        b"POST /v1/check HTTP/1.1\r\nhost: bridge\r\ncontent-length: 20\r\n\r\nk,1,1,1",
    )
    .await;
    let status = status_line(&mut conn, body_timeout + SLACK).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 408 Request Timeout"));

    let (request, body) = streamed(None);
    body.send(Bytes::from_static(b"k,1,1,1")).await.unwrap();
    let (status, reply) = tokio::time::timeout(body_timeout + SLACK, h2c(bridge.addr, request))
        .await
        .expect("an answer at the deadline");
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{reply}");
    assert!(reply.contains("did not arrive"), "{reply}");
}

#[tokio::test]
async fn checks_succeed_while_slowloris_connections_are_held_open() {
    let valkey = Valkey::start();
    let bridge = start_with(&valkey.url(), bounded(LONG, LONG, 64)).await;
    let mut held = Vec::new();
    for _ in 0..24 {
        held.push(connect(bridge.addr, PARTIAL_HEAD).await);
        held.push(connect(bridge.addr, b"").await);
    }
    let check = || req(Method::POST, "/v1/check", "rl:k,1,1,1000,1\n");
    let (status, reply) = http1(bridge.addr, check()).await;
    assert_eq!(
        (status, &reply[reply.find(' ').unwrap()..]),
        (StatusCode::OK, " 1,0,1000,0\n")
    );
    let (status, _) = h2c(bridge.addr, check()).await;
    assert_eq!(status, StatusCode::OK);
    for conn in &mut held {
        assert!(until_closed(conn, Duration::from_millis(50))
            .await
            .is_none());
    }
}

/// Sends a whole health check on a new connection: the status line, or `None` when the
/// bridge closes the connection without answering (or does not answer in time).
async fn healthz(addr: SocketAddr) -> Option<String> {
    let mut conn = connect(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost: bridge\r\nconnection: close\r\n\r\n",
    )
    .await;
    status_line(&mut conn, SLACK).await
}

#[tokio::test]
async fn past_a_cap_of_connections_that_checked_new_ones_are_closed_unanswered() {
    let valkey = Valkey::start();
    let bridge = start_with(&valkey.url(), bounded(LONG, LONG, 4)).await;
    // Checks whose bodies never come: held by peers that have checked, so no new
    // connection takes their slots.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(bridge.addr, STALLED_CHECK).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        healthz(bridge.addr).await,
        None,
        "a fifth connection is refused"
    );
    for conn in &mut held {
        assert!(until_closed(conn, Duration::from_millis(50))
            .await
            .is_none());
    }
    // A connection that ends gives its slot back.
    held.pop();
    let deadline = Instant::now() + SLACK;
    while healthz(bridge.addr).await.is_none() {
        assert!(Instant::now() < deadline, "no slot came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_full_cap_frees_itself_by_the_header_deadline() {
    let valkey = Valkey::start();
    let header_timeout = Duration::from_millis(500);
    let bridge = start_with(&valkey.url(), bounded(header_timeout, LONG, 2)).await;
    // Held by the client for the whole test: only the bridge can free their slots.
    let _held = [
        connect(bridge.addr, PARTIAL_HEAD).await,
        connect(bridge.addr, PARTIAL_HEAD).await,
    ];
    let deadline = Instant::now() + header_timeout + SLACK;
    loop {
        if healthz(bridge.addr).await.as_deref() == Some("HTTP/1.1 200 OK") {
            break;
        }
        assert!(Instant::now() < deadline, "the slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
