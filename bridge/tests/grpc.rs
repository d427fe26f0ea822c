//! The bridge as the filter's default transport sees it: one long-lived gRPC stream
//! (`/ratelimit.v1.Bridge/Check`, h2c), messages answered as their checks finish and paired
//! by exchange id, protocol violations and shutdown ending the stream with a gRPC status.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use bytes::Bytes;
use common::server::{start, start_with, start_with_token, without_token, Bridge, RELAXED};
use common::Valkey;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratelimit_bridge::grpc::{prefixed, Deframer};
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The gateway's side of one stream: messages in, replies and the final status out.
struct Stream {
    send: Option<mpsc::Sender<Result<Frame<Bytes>, Infallible>>>,
    body: Incoming,
    deframer: Deframer,
}

async fn open(bridge: &Bridge) -> (StatusCode, Stream) {
    open_as(bridge, None).await
}

/// Opens a stream with `authorization` as its initial metadata.
async fn open_as(bridge: &Bridge, authorization: Option<&str>) -> (StatusCode, Stream) {
    let io = TokioIo::new(TcpStream::connect(bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let (send, frames) = mpsc::channel(16);
    let body = StreamBody::new(receiver_stream(frames));
    let mut request = Request::post("http://bridge/ratelimit.v1.Bridge/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let request = request.body(body).unwrap();
    let response: Response<Incoming> = sender.send_request(request).await.unwrap();
    let status = response.status();
    let stream = Stream {
        send: Some(send),
        body: response.into_body(),
        deframer: Deframer::default(),
    };
    (status, stream)
}

fn receiver_stream<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = T> + Send>> {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|t| (t, rx))
    }))
}

impl Stream {
    async fn send(&self, message: &str) {
        self.send_bytes(prefixed(message.as_bytes())).await;
    }

    async fn send_bytes(&self, bytes: Bytes) {
        let frame = Frame::data(bytes);
        self.send.as_ref().unwrap().send(Ok(frame)).await.unwrap();
    }

    /// The next reply message, or the gRPC status the stream ended with.
    async fn next(&mut self) -> Result<String, String> {
        loop {
            if let Some(m) = self.deframer.next_message().unwrap() {
                return Ok(String::from_utf8(m.to_vec()).unwrap());
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("the bridge answers")
                .expect("a frame before the end")
                .unwrap();
            match frame.into_data() {
                Ok(data) => self.deframer.push(&data),
                Err(frame) => {
                    let t = frame.into_trailers().unwrap();
                    let status = t.get("grpc-status").unwrap().to_str().unwrap();
                    let message = t.get("grpc-message").map_or("", |v| v.to_str().unwrap());
                    return Err(format!("{status} {message}").trim().to_string());
                }
            }
        }
    }
}

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
    let limits = ratelimit_bridge::limits::Limits {
        header_timeout: short,
        body_timeout: short,
        ..RELAXED
    };
    let bridge = start_with(&valkey.url(), without_token(limits)).await;
    let (_, mut s) = open(&bridge).await;
    tokio::time::sleep(short * 5).await;
    s.send("1\ng:idle,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
}

#[tokio::test]
async fn a_message_that_stalls_midway_ends_the_stream_at_the_body_deadline() {
    let valkey = Valkey::start();
    let limits = ratelimit_bridge::limits::Limits {
        body_timeout: Duration::from_millis(300),
        ..RELAXED
    };
    let bridge = start_with(&valkey.url(), without_token(limits)).await;
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
    assert_eq!(common::buckets::script_calls(&valkey), 0);
    let (status, mut s) = open_as(&bridge, Some("Bearer s3cret-Token")).await;
    assert_eq!(status, StatusCode::OK);
    s.send("1\ng:auth,5,1,1000,1\n").await;
    assert!(s.next().await.unwrap().starts_with("1\n"));
}
