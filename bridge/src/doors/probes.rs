//! Health and metrics (`GET /healthz`, its alias `/healthcheck`, `GET /metrics`): answered on
//! the bridge's port, and on plaintext probe ports of their own (`--probe-listen`) for a
//! deployment whose kubelet probes and Prometheus scrapes cannot speak the port's TLS, as
//! envoyproxy/ratelimit's deployments (Envoy Gateway's) probe its HTTP port and scrape a
//! Prometheus port beside its TLS gRPC port.

use crate::doors::rls::metrics::RlsMetrics;
use crate::doors::rls::Rls;
use crate::engine::regions::metrics::GlobalMetrics;
use crate::engine::Engine;
use crate::ops::metrics;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::text;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// Connections a probe port serves at once: a kubelet and a scraper need a few, and a peer
/// that opens many idle ones to starve the probes (so that the pod is restarted) must hold
/// this many, each for no longer than the header timeout; an idle connection costs a task
/// and a small buffer.
const PROBE_CONNECTIONS: usize = 1024;
/// A probe's request must arrive whole within this: a kubelet's probe times out after 1 s
/// by default, and sends its request at once.
const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

pub fn reply(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response
}

/// The answer to a probe's `method` and `path`; `None` for a path that is not a probe's.
/// Redis's health is the `engine`'s store's; the metrics are every series of the bridge
/// (`render`), the rate limit service's from `rls`.
pub async fn answer(
    engine: &Engine,
    rls: Option<&Rls>,
    method: &Method,
    path: &str,
) -> Option<Reply> {
    let probe = matches!(path, "/healthz" | "/healthcheck" | "/metrics");
    Some(match (method, path) {
        (_, _) if !probe => return None,
        (&Method::GET, "/metrics") => scrape(engine, rls),
        (&Method::GET, _) => healthz(engine).await,
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
    })
}

async fn healthz(engine: &Engine) -> Reply {
    if engine.store().ping().await {
        reply(StatusCode::OK, "ok\n")
    } else {
        reply(StatusCode::SERVICE_UNAVAILABLE, "redis unreachable\n")
    }
}

/// Every series of the bridge as one OpenMetrics text, in the order one registry held them:
/// the regions' leases, the store's and the doors' (`metrics`), the rate limit service's.
/// A bridge without regions or without the service shows theirs as one that has them
/// starts: at 0, or no series yet.
pub fn render(engine: &Engine, rls: Option<&Rls>) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match engine.regions() {
        Some(regions) => regions.metrics().encode(&mut out)?,
        None => GlobalMetrics::new().encode(&mut out)?,
    }
    engine.store().metrics().encode(&mut out)?;
    match rls {
        Some(rls) => rls.metrics().encode(&mut out)?,
        None => RlsMetrics::new().encode(&mut out)?,
    }
    text::encode_eof(&mut out)?;
    Ok(out)
}

fn scrape(engine: &Engine, rls: Option<&Rls>) -> Reply {
    match render(engine, rls) {
        Ok(text) => {
            let mut answer = reply(StatusCode::OK, text);
            answer.headers_mut().insert(
                "content-type",
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            answer
        }
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

/// Serves probes alone on `listener` (HTTP/1.1, plaintext) until dropped (aborted): any
/// other path is not found, and a connection past the few it serves at once waits.
pub async fn serve(listener: TcpListener, engine: Engine, rls: Option<Arc<Rls>>) {
    let room = Arc::new(Semaphore::new(PROBE_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&room).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("probe port: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (engine, rls) = (engine.clone(), rls.clone());
        let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
            let (engine, rls) = (engine.clone(), rls.clone());
            async move {
                let path = req.uri().path();
                let answer = answer(&engine, rls.as_deref(), req.method(), path).await;
                Ok::<_, Infallible>(
                    answer.unwrap_or_else(|| reply(StatusCode::NOT_FOUND, "not found\n")),
                )
            }
        });
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(PROBE_HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                log::debug!("probe port: {e}");
            }
            drop(permit);
        });
    }
}
