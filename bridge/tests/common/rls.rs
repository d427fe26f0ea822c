//! The rate limit service in process: a bridge serving envoyproxy/ratelimit YAML from a
//! scratch directory against a real Valkey, called over h2c as Envoy calls it.

use super::prefixed;
use super::server::{start_with, without_token, Bridge, RELAXED};
use super::Valkey;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use ratelimit_bridge::doors::rls::proto::{RateLimitRequest, RateLimitResponse, PATH};
use ratelimit_bridge::doors::rls::{Options, Rls};
use ratelimit_protocol::Deframer;
use std::sync::Arc;
use test_support::pki::Scratch;
use tokio::net::TcpStream;

/// A bridge serving the files of one directory (and the Valkey it started, if it did).
pub struct Served {
    pub bridge: Bridge,
    pub dir: Scratch,
    pub valkey: Option<Valkey>,
    /// The task reading the files again on a change, ended with the bridge.
    pub watching: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(task) = self.watching.take() {
            task.abort();
        }
    }
}

/// A bridge serving `files` with `options` against a Valkey of its own.
pub async fn serve(files: &[(&str, &str)], options: impl Into<Options>) -> Served {
    let valkey = Valkey::start();
    let mut served = serve_on(&valkey.url(), files, options).await.unwrap();
    served.valkey = Some(valkey);
    served
}

/// A bridge serving `files` with `options` against the Redis at `url`, or why the files
/// did not load. With `watch`, the files are read again when they change.
pub async fn serve_on(
    url: &str,
    files: &[(&str, &str)],
    options: impl Into<Options>,
) -> Result<Served, String> {
    serve_watching(url, files, options, false).await
}

/// As `serve_on`, reloading the files on a change when `watch` is set.
pub async fn serve_watching(
    url: &str,
    files: &[(&str, &str)],
    options: impl Into<Options>,
    watch: bool,
) -> Result<Served, String> {
    let dir = Scratch::new();
    for (name, text) in files {
        dir.write(name, text);
    }
    let rls = Arc::new(Rls::load(dir.path().to_owned(), "rl", options)?);
    let watching = watch.then(|| tokio::spawn(Arc::clone(&rls).watch()));
    let mut config = without_token(RELAXED);
    config.rls = Some(rls);
    let bridge = start_with(url, config).await;
    Ok(Served {
        bridge,
        dir,
        valkey: None,
        watching,
    })
}

/// One call: the answer, or the gRPC status and message it ended with instead.
pub async fn call(
    served: &Served,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, String> {
    let io = TokioIo::new(TcpStream::connect(served.bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let body = Full::new(prefixed(&request.encode_to_vec()));
    let request = Request::post(format!("http://bridge{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let head = response.headers().clone();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or(head);
    let status = trailers.get("grpc-status").map(|v| v.to_str().unwrap());
    if status != Some("0") {
        let why = trailers.get("grpc-message").map(|v| v.to_str().unwrap());
        return Err(format!("{status:?} {why:?}"));
    }
    let mut deframer = Deframer::default();
    deframer.push(&collected.to_bytes());
    Ok(RateLimitResponse::decode(deframer.next_message().unwrap().unwrap().as_slice()).unwrap())
}
