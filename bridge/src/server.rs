//! The HTTP side: `POST /v1/check` and `GET /healthz` over HTTP/1.1 and h2c on one port,
//! with graceful shutdown (in-flight checks finish, new connections are refused).

use crate::store::Store;
use crate::wire;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Longest wait for in-flight requests once shutdown is asked for.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves connections from `listener` until `shutdown` completes, then drains.
pub async fn run(listener: TcpListener, store: Store, shutdown: impl Future<Output = ()>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
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
                let store = store.clone();
                let service = hyper::service::service_fn(move |req| handle(store.clone(), req));
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
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        log::warn!("drain timed out after {DRAIN_TIMEOUT:?}");
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

async fn handle(store: Store, req: Request<Incoming>) -> Result<Reply, hyper::Error> {
    Ok(match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/check") => check(&store, req).await,
        (&Method::GET, "/healthz") => {
            if store.ping().await {
                reply(StatusCode::OK, "ok\n")
            } else {
                reply(StatusCode::SERVICE_UNAVAILABLE, "redis unreachable\n")
            }
        }
        (_, "/v1/check" | "/healthz") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => reply(StatusCode::NOT_FOUND, "not found\n"),
    })
}

async fn check(store: &Store, req: Request<Incoming>) -> Reply {
    let body = match Limited::new(req.into_body(), wire::MAX_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("unreadable body: {e}\n"),
            )
        }
    };
    let checks = match wire::parse_batch(&body) {
        Ok(checks) => checks,
        Err(e) => return reply(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let outcomes = store.check_all(&checks).await;
    for failure in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        log::warn!("check failed: {failure}");
    }
    reply(StatusCode::OK, wire::render_reply(&outcomes))
}
