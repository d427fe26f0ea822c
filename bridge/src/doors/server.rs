//! The network side: every door but the commands on one port: `POST /v1/check` (`http`,
//! HTTP/1.1 and h2c), the gRPC stream `/ratelimit.v1.Bridge/Check` (`grpc`, h2c), the rate
//! limit service (`rls`), `/admin/` (`admin`), `GET /healthz` and `GET /metrics`
//! (`probes`), with graceful shutdown (in-flight checks finish, streams end with
//! UNAVAILABLE so gateways reconnect elsewhere, new connections are refused). What a
//! connection may hold is `guards::deadlines`'s; who may check is `guards::access`'s.

use super::admin::{self, Admin};
use super::guards::access::Access;
use super::guards::budget::{Budget, Charge, Share};
use super::guards::deadlines::{
    self, Activity, Busy, Connection, ConnectionBounds, Unwritten, DRAIN_TIMEOUT,
};
use super::guards::slots::{Peer, Slots};
use super::probes::{self, reply};
use super::rls::{self, Rls};
use super::{grpc, http};
use crate::engine::overrides::registry;
use crate::engine::plans;
use crate::engine::Engine;
use crate::ops::labels::Failure;
use crate::store::health;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use ratelimit_config::config::Config as Plugin;
use ratelimit_protocol::{GRPC_METHOD, GRPC_SERVICE, PATH};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

/// HTTP/2 keep-alive: a connection whose peer stops answering pings (a gateway gone without
/// a FIN) is closed, so that a long-lived stream does not hold its slot forever. A live
/// peer answers pings by itself, so an idle stream is never closed by this.
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 streams per connection: a gateway worker needs one for its gRPC stream, or a few
/// for callouts; past this a client opens another connection (and takes another slot).
const H2_MAX_STREAMS: u32 = 256;
/// The bridge's requests carry a handful of short headers.
const H2_MAX_HEADER_BYTES: u32 = 16 * 1024;

/// How the server treats its clients.
#[derive(Clone)]
pub struct Config {
    pub bounds: ConnectionBounds,
    /// Who may check: the gateways' token.
    pub access: Access,
    /// Who may use `/admin/`: the operators' token, never the gateways' (open: nobody).
    pub admin: Access,
    /// The gateways' plugin configuration, for `GET /admin/usage` (`--config`).
    pub plugin: Option<Arc<Plugin>>,
    /// Envoy's Rate Limit Service (`--rls-config`).
    pub rls: Option<Arc<Rls>>,
    /// TLS on the port (`--tls-cert`); plaintext without.
    pub tls: Option<TlsAcceptor>,
}

/// Serves connections from `listener` until `shutdown` completes, then drains; every door
/// runs its lines through `engine`.
pub async fn run(
    listener: TcpListener,
    engine: Engine,
    config: Config,
    shutdown: impl Future<Output = ()>,
) {
    let bounds = config.bounds;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT)
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_BYTES);
    let mut slots = Slots::new(bounds.max_connections);
    let budget = Budget::new(bounds.max_pending_mib);
    let watching = tokio::spawn(health::watch(engine.store().clone()));
    let refreshing = tokio::spawn(registry::refresh(engine.clone()));
    let following = tokio::spawn(plans::registry::refresh(
        engine.store().clone(),
        engine.plans().clone(),
    ));
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
                // Over the cap: closed at once (dropped), see `slots`.
                let metrics = engine.store().metrics();
                let Some((slot, peer)) = slots.take(metrics).await else { continue };
                let _ = stream.set_nodelay(true);
                let served = Served {
                    engine: engine.clone(),
                    stop: stop_seen.clone(),
                    config: config.clone(),
                    share: budget.share(),
                    activity: Activity::default(),
                    peer: Arc::clone(&peer),
                };
                let held = Connection { activity: served.activity.clone(), peer, slot };
                let builder = builder.clone();
                match config.tls.clone() {
                    None => {
                        tokio::spawn(serve(builder, TokioIo::new(stream), served, held));
                    }
                    // The handshake runs on the connection's own task, under the header
                    // deadline, holding its slot: a peer that never finishes one takes
                    // nothing from the accept loop.
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            let shake = tokio::time::timeout(
                                bounds.header_timeout,
                                acceptor.accept(stream),
                            );
                            match shake.await {
                                Ok(Ok(tls)) => serve(builder, TokioIo::new(tls), served, held).await,
                                Ok(Err(e)) => log::debug!("TLS handshake failed: {e}"),
                                Err(_) => log::debug!("TLS handshake not done in time"),
                            }
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    log::info!("shutting down: draining in-flight requests");
    let _ = stopping.send(true);
    // Each connection has DRAIN_TIMEOUT from now; a little more covers the last ones.
    if !slots.drained(DRAIN_TIMEOUT + Duration::from_secs(1)).await {
        log::warn!("drain timed out after {DRAIN_TIMEOUT:?}");
    }
    watching.abort();
    refreshing.abort();
    following.abort();
}

/// Serves one connection's requests under its deadlines until it ends.
async fn serve<S>(
    builder: auto::Builder<TokioExecutor>,
    io: TokioIo<S>,
    served: Served,
    held: Connection,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (bounds, stop, store) = (
        served.config.bounds,
        served.stop.clone(),
        served.engine.store().clone(),
    );
    let service = hyper::service::service_fn(move |req| {
        let served = served.clone();
        async move { Ok::<_, hyper::Error>(served.handle(req).await) }
    });
    let conn = builder.serve_connection(io, service).into_owned();
    deadlines::drive(conn, held, bounds, stop, store).await;
}

type Reply = probes::Reply;

/// What a connection's requests are served with.
#[derive(Clone)]
struct Served {
    engine: Engine,
    stop: watch::Receiver<bool>,
    config: Config,
    /// The connection's share of the budget.
    share: Share,
    activity: Activity,
    peer: Arc<Peer>,
}

/// A body that holds what its answer holds until the connection has taken it to write: an
/// open gRPC stream's request in progress (`Busy`), an exchange's share of the budget, and
/// the answer's place under the write deadline. A whole answer is taken in one go, and its
/// size is passed on, so it still goes out with a `content-length`, not chunked.
struct Held {
    body: UnsyncBoxBody<Bytes, Infallible>,
    busy: Option<Busy>,
    charge: Option<Charge>,
    unwritten: Option<Unwritten>,
}

impl Held {
    fn reply(
        reply: Reply,
        busy: Option<Busy>,
        charge: Option<Charge>,
        unwritten: Option<Unwritten>,
    ) -> Reply {
        reply.map(|body| {
            Held {
                body,
                busy,
                charge,
                unwritten,
            }
            .boxed_unsync()
        })
    }
}

impl Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if frame.is_ready() {
            // Taken by the connection: what is left to wait for is the peer.
            (self.charge, self.unwritten) = (None, None);
        }
        if matches!(frame, Poll::Ready(None)) {
            self.busy = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Served {
    /// Serves one request: a gRPC stream holds its connection busy while it is open; any
    /// other answer ends its request once it is made, written or not.
    async fn handle(self, req: Request<Incoming>) -> Reply {
        let busy = self.activity.busy();
        let path = req.uri().path();
        let stream = path.strip_prefix('/').and_then(|p| p.split_once('/'))
            == Some((GRPC_SERVICE, GRPC_METHOD));
        let rls = self
            .config
            .rls
            .as_ref()
            .filter(|_| path == rls::proto::PATH);
        if stream || path == PATH || rls.is_some() {
            if !self.config.access.admits(req.headers()) {
                log::debug!("refused a request to {path} without the token");
                self.engine.store().metrics().failure(Failure::Unauthorized);
                let mut refused = reply(StatusCode::UNAUTHORIZED, "unauthorized\n");
                refused
                    .headers_mut()
                    .insert("www-authenticate", HeaderValue::from_static("Bearer"));
                return self.answered(refused, None);
            }
            self.peer.prove();
        }
        if stream {
            let checks = stream_checks(&self, req);
            return Held::reply(checks, Some(busy), None, None);
        }
        if let Some(rls) = rls {
            let timeout = self.config.bounds.body_timeout;
            let share = self.share.clone();
            let (answer, charge) = rls.serve(&self.engine, share, req, timeout).await;
            drop(busy);
            return self.answered(answer, charge);
        }
        if path.starts_with(admin::PREFIX) {
            let answer = self.admin(req).await;
            return self.answered(answer, None);
        }
        let (answer, charge) = match (req.method(), path) {
            (&Method::POST, PATH) => {
                let timeout = self.config.bounds.body_timeout;
                http::check(&self.engine, timeout, &self.share, req).await
            }
            (_, PATH) => (
                reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
                None,
            ),
            (method, path) => {
                match probes::answer(&self.engine, self.config.rls.as_deref(), method, path).await {
                    Some(answer) => (answer, None),
                    None => (reply(StatusCode::NOT_FOUND, "not found\n"), None),
                }
            }
        };
        drop(busy);
        self.answered(answer, charge)
    }

    /// `answer`, waiting for its connection to take it under the write deadline.
    fn answered(&self, answer: Reply, charge: Option<Charge>) -> Reply {
        Held::reply(answer, None, charge, Some(self.activity.unwritten()))
    }

    async fn admin(&self, req: Request<Incoming>) -> Reply {
        let admin = Admin {
            engine: &self.engine,
            access: &self.config.admin,
            plugin: self.config.plugin.as_deref(),
            rls: self.config.rls.as_deref(),
        };
        let query = req.uri().query().unwrap_or_default();
        let (status, body) = admin
            .answer(req.method(), req.uri().path(), query, req.headers())
            .await;
        let mut answer = reply(status, body);
        if status == StatusCode::OK {
            answer
                .headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
        } else if status == StatusCode::UNAUTHORIZED {
            answer
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        answer
    }
}

/// Starts serving a gRPC stream and answers with its headers at once; the messages and the
/// trailers follow as the stream goes on.
fn stream_checks(served: &Served, req: Request<Incoming>) -> Reply {
    let metrics = served.engine.store().metrics();
    let grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if req.method() != Method::POST || req.version() != Version::HTTP_2 || !grpc {
        metrics.failure(Failure::NotGrpc);
        return reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "gRPC (POST, HTTP/2, application/grpc) only\n",
        );
    }
    let (out, frames) = mpsc::channel(grpc::REPLIES_QUEUED);
    tokio::spawn(grpc::serve(
        grpc::Serving {
            engine: served.engine.clone(),
            share: served.share.clone(),
            activity: served.activity.clone(),
            stop: served.stop.clone(),
            message_timeout: served.config.bounds.body_timeout,
        },
        req.into_body(),
        out,
    ));
    // A reply's share of the budget and its place under the write deadline end as the
    // connection takes it.
    let body = stream::unfold(frames, |mut frames| async move {
        let (frame, _held) = frames.recv().await?;
        Some((Ok::<_, Infallible>(frame), frames))
    });
    let mut response = Response::new(StreamBody::new(body).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}
