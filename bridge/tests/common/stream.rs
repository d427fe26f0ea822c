//! The gateway's side of the gRPC stream (`/ratelimit.v1.Bridge/Check`, h2c): messages
//! in, replies and the final gRPC status out.

use super::prefixed;
use super::server::Bridge;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratelimit_protocol::Deframer;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The gateway's side of one stream: messages in, replies and the final status out.
pub struct Stream {
    /// The stream's request body; taken (dropped) to close the gateway's side.
    pub send: Option<mpsc::Sender<Result<Frame<Bytes>, Infallible>>>,
    /// The bridge's replies and trailers.
    body: Incoming,
    /// Splits the replies into messages.
    deframer: Deframer,
}

pub async fn open(bridge: &Bridge) -> (StatusCode, Stream) {
    open_as(bridge, None).await
}

/// Opens a stream with `authorization` as its initial metadata.
pub async fn open_as(bridge: &Bridge, authorization: Option<&str>) -> (StatusCode, Stream) {
    open_at(bridge.addr, authorization).await
}

/// `open_as` to a bridge at `addr` (a process, or in-process).
pub async fn open_at(addr: SocketAddr, authorization: Option<&str>) -> (StatusCode, Stream) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
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

pub fn receiver_stream<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = T> + Send>> {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|t| (t, rx))
    }))
}

impl Stream {
    pub async fn send(&self, message: &str) {
        self.send_bytes(prefixed(message.as_bytes())).await;
    }

    pub async fn send_bytes(&self, bytes: Bytes) {
        let frame = Frame::data(bytes);
        self.send.as_ref().unwrap().send(Ok(frame)).await.unwrap();
    }

    /// The next reply message, or the gRPC status the stream ended with.
    pub async fn next(&mut self) -> Result<String, String> {
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
