//! The network side: `POST /v1/check` (HTTP/1.1 and h2c), the gRPC stream
//! `/ratelimit.v1.Bridge/Check` (h2c) and `GET /healthz`, all on one port, with graceful
//! shutdown (in-flight checks finish, streams end with UNAVAILABLE so gateways reconnect
//! elsewhere, new connections are refused).

use crate::store::Store;
use crate::{grpc, wire};
use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use ratelimit_protocol::{GRPC_METHOD, GRPC_SERVICE, MAX_BODY, PATH};
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// Longest wait for in-flight requests once shutdown is asked for.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves connections from `listener` until `shutdown` completes, then drains.
pub async fn run(listener: TcpListener, store: Store, shutdown: impl Future<Output = ()>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let (stopping, stop_seen) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        log::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (store, stop) = (store.clone(), stop_seen.clone());
                let service = hyper::service::service_fn(move |req| {
                    handle(store.clone(), stop.clone(), req)
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        log::debug!("connection ended: {e}");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    log::info!("shutting down: draining in-flight requests");
    let _ = stopping.send(true);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        log::warn!("drain timed out after {DRAIN_TIMEOUT:?}");
    }
}

type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response
}

async fn handle(
    store: Store,
    stop: watch::Receiver<bool>,
    req: Request<Incoming>,
) -> Result<Reply, hyper::Error> {
    let path = req.uri().path();
    if path.strip_prefix('/').and_then(|p| p.split_once('/')) == Some((GRPC_SERVICE, GRPC_METHOD)) {
        return Ok(stream_checks(store, stop, req));
    }
    Ok(match (req.method(), path) {
        (&Method::POST, PATH) => check(&store, req).await,
        (&Method::GET, "/healthz") => {
            if store.ping().await {
                reply(StatusCode::OK, "ok\n")
            } else {
                reply(StatusCode::SERVICE_UNAVAILABLE, "redis unreachable\n")
            }
        }
        (_, PATH | "/healthz") => reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
        _ => reply(StatusCode::NOT_FOUND, "not found\n"),
    })
}

/// Starts serving a gRPC stream and answers with its headers at once; the messages and the
/// trailers follow as the stream goes on.
fn stream_checks(store: Store, stop: watch::Receiver<bool>, req: Request<Incoming>) -> Reply {
    let grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if req.method() != Method::POST || req.version() != Version::HTTP_2 || !grpc {
        return reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "gRPC (POST, HTTP/2, application/grpc) only\n",
        );
    }
    let (out, frames) = mpsc::channel(16);
    tokio::spawn(grpc::serve(store, req.into_body(), out, stop));
    let body = stream::unfold(frames, |mut frames| async move {
        let frame = frames.recv().await?;
        Some((Ok::<_, Infallible>(frame), frames))
    });
    let mut response = Response::new(StreamBody::new(body).boxed_unsync());
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    response
}

async fn check(store: &Store, req: Request<Incoming>) -> Reply {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("unreadable body: {e}\n"),
            )
        }
    };
    let mut answer = String::new();
    match wire::answer(store, &body, &mut answer).await {
        Ok(()) => reply(StatusCode::OK, answer),
        Err(bad) => reply(StatusCode::BAD_REQUEST, format!("{bad}\n")),
    }
}
