//! Envoy's Rate Limit Service on the bridge (`--rls-config`): the unary gRPC call
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` that Envoy's own
//! `ratelimit` filter makes (and so Envoy Gateway, Istio, Contour and the AI gateways built
//! on it), answered from the same token buckets, merged into the same script calls as the
//! wasm filter's checks. Served on the bridge's port, behind the gateways' token.
//!
//! - `proto`: the call's protobuf messages.
//! - `metadata`: a limit's YAML `metadata`, read as a protobuf `Struct`.
//! - `metrics`: the service's per-limit series, named as envoyproxy/ratelimit names them.
//! - `raw`: envoyproxy/ratelimit's YAML configuration as written, and the protocol's units.
//! - `limits`: that configuration checked, and its lookup.
//! - `bounds`: the size and depth a configuration's YAML is held to before it is parsed.
//! - `source`: the configuration's files, and what tells that they changed.
//! - `wildcard`: a configured value with `*`s, matched as envoyproxy/ratelimit matches it.
//! - `hits`: a number of hits as Envoy reads one from a string.
//! - `lines`: what one call asks of which bucket, as the lines that run it: checks, costs,
//!   reservations.
//! - `answer`: one call answered.
//! - `operators`: the service's buckets as the operator's `override` and `usage` name them.
//! - `dynamic`: envoyproxy/ratelimit's dynamic metadata of a call.
//! - `xds`: the configuration from an xDS server, as Envoy Gateway serves it.
//! - `args`: the service's flags, and the service they make.
//! - `compat`: envoyproxy/ratelimit's environment variables, read as the bridge's.

pub mod answer;
pub mod args;
pub mod bounds;
pub mod compat;
pub mod dynamic;
pub mod hits;
pub mod limits;
pub mod lines;
pub mod metadata;
pub mod metrics;
pub mod operators;
pub mod proto;
pub mod raw;
pub mod source;
pub mod wildcard;
pub mod xds;

use super::grpc;
use super::guards::budget::{Charge, Share};
use crate::engine::Engine;
use crate::store::check::RuleSpec;
use answer::{Headers, ResponseHeaders, Service};
use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Limited, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use limits::Limits;
use lines::Refusal;
use metrics::RlsMetrics;
use prost::Message;
use ratelimit_protocol::{prefixed, Deframer};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest request message read: 32 descriptors of 16 entries of short strings fit well.
pub const MAX_REQUEST: usize = 64 * 1024;
/// How often the configuration's files are looked at for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// How the service reads its configuration and answers, besides the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub headers: Headers,
    /// Every call over a limit answered OK, counted as shadow (envoyproxy/ratelimit's
    /// `SHADOW_MODE`, a dry run of a whole configuration).
    pub shadow: bool,
    /// The files (or xDS resources) of one domain merged into one tree, as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG` merges them; else a domain twice is
    /// refused.
    pub merge: bool,
    /// envoyproxy/ratelimit's dynamic metadata added to every answer (its
    /// `RESPONSE_DYNAMIC_METADATA`, `dynamic`).
    pub dynamic_metadata: bool,
}

impl From<Headers> for Options {
    fn from(headers: Headers) -> Options {
        Options {
            headers,
            shadow: false,
            merge: false,
            dynamic_metadata: false,
        }
    }
}

impl From<ResponseHeaders> for Options {
    fn from(kind: ResponseHeaders) -> Options {
        Options::from(Headers::from(kind))
    }
}

/// The service: the configuration in force and how answers are made.
pub struct Rls {
    /// The files it was read from (`None`: it comes from xDS).
    path: Option<PathBuf>,
    /// Whether a domain's files are merged (`Options::merge`).
    merge: bool,
    /// `None` until a configuration loads: every call fails meanwhile.
    limits: RwLock<Option<Arc<Limits>>>,
    service: Service,
}

type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

impl Rls {
    /// The service with the configuration at `path` (`--rls-config`), keying buckets under
    /// `prefix`; an error if it does not load. It blocks: the bridge calls it off its
    /// runtime, as it reads every configuration (`read`).
    pub fn load(path: PathBuf, prefix: &str, options: impl Into<Options>) -> Result<Rls, String> {
        let options = options.into();
        let limits = source::load(&path, options.merge)?;
        log::info!(
            "rate limit service: {} domain(s) from {}",
            limits.domains(),
            path.display()
        );
        Ok(Rls::new(Some(limits), Some(path), prefix, options))
    }

    /// The service with the configuration at `path`, or, while it does not load, none:
    /// every call then fails ("no rate limit configuration loaded", so Envoy's
    /// `failure_mode_deny` decides) until a change to the files loads, as
    /// envoyproxy/ratelimit keeps serving, and a Deployment does not crash-loop on a bad
    /// ConfigMap. It blocks, as `load`.
    pub fn load_or_wait(path: PathBuf, prefix: &str, options: impl Into<Options>) -> Rls {
        let options = options.into();
        match Rls::load(path.clone(), prefix, options.clone()) {
            Ok(rls) => rls,
            Err(e) => {
                log::error!(
                    "rate limit service: no configuration loaded, every call fails until \
                     one does: {e}"
                );
                Rls::new(None, Some(path), prefix, options)
            }
        }
    }

    /// The service with no domain configured yet, until an xDS server (`xds::follow`)
    /// configures some: every descriptor meanwhile has no limit, as envoyproxy/ratelimit
    /// answers with `FORCE_START_WITHOUT_INITIAL_CONFIG`, which Envoy Gateway sets.
    pub fn unconfigured(prefix: &str, options: impl Into<Options>) -> Rls {
        Rls::new(Some(Limits::default()), None, prefix, options.into())
    }

    fn new(limits: Option<Limits>, path: Option<PathBuf>, prefix: &str, options: Options) -> Rls {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Rls {
            path,
            merge: options.merge,
            limits: RwLock::new(limits.map(Arc::new)),
            service: Service {
                prefix: prefix.to_owned(),
                headers: options.headers,
                shadow: options.shadow,
                dynamic_metadata: options.dynamic_metadata,
                costs: AtomicU64::new(0),
                cost_ids: format!("rls{}-{}", started.as_nanos(), std::process::id()),
                metrics: RlsMetrics::new(),
            },
        }
    }

    /// Puts `limits` in force.
    fn install(&self, limits: Limits) {
        *self.limits.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(limits));
    }

    fn limits(&self) -> Option<Arc<Limits>> {
        self.limits
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The bucket of `domain`'s descriptor `entries` (`key=value`) in the configuration in
    /// force, as `/admin/usage` reads it: its key prefix, its configured path and the spec
    /// to read it with.
    pub fn usage_bucket(
        &self,
        domain: &str,
        entries: &[String],
    ) -> Result<(String, String, RuleSpec), String> {
        let limits = self.limits().ok_or("no rate limit configuration loaded")?;
        let prefix = &self.service.prefix;
        let (rule, spec) = operators::bucket(&limits, prefix, domain, entries)?;
        Ok((prefix.clone(), rule, spec))
    }

    /// The service's per-limit series, for `/metrics`.
    pub fn metrics(&self) -> &RlsMetrics {
        &self.service.metrics
    }

    /// Reads the configuration again whenever its files change, until dropped (aborted);
    /// returns at once for a configuration from xDS.
    pub async fn watch(self: Arc<Rls>) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let mut seen = source::stamp(&path);
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            let now = source::stamp(&path);
            if now == seen {
                continue;
            }
            seen = now;
            match read(path.clone(), self.merge).await {
                Ok(limits) => {
                    log::info!(
                        "rate limit service: reloaded {} domain(s) from {}",
                        limits.domains(),
                        path.display()
                    );
                    self.install(limits);
                }
                Err(e) => log::error!("rate limit service: kept the configuration in force: {e}"),
            }
        }
    }

    /// Answers one `ShouldRateLimit` call whose caller was admitted, through the `engine`,
    /// and its share of the budget, taken before its body is read (as an exchange's is):
    /// the request message is read within `body_timeout`, and the answer is a gRPC
    /// response with its status in the trailers (or alone, for a call that was not
    /// answered).
    pub async fn serve(
        &self,
        engine: &Engine,
        share: Share,
        req: Request<Incoming>,
        body_timeout: Duration,
    ) -> (Reply, Option<Charge>) {
        let framed = MAX_REQUEST + 5;
        let expected = req
            .body()
            .size_hint()
            .exact()
            .map_or(framed, |n| n as usize);
        let charge = share.charge(expected.min(framed)).await;
        (self.answer(engine, req, body_timeout).await, charge)
    }

    async fn answer(
        &self,
        engine: &Engine,
        req: Request<Incoming>,
        body_timeout: Duration,
    ) -> Reply {
        let grpc = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc {
            return status_only(grpc::INVALID_ARGUMENT, "application/grpc only");
        }
        let read = Limited::new(req.into_body(), MAX_REQUEST + 5).collect();
        let body = match tokio::time::timeout(body_timeout, read).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return status_only(grpc::INVALID_ARGUMENT, &format!("unreadable: {e}")),
            Err(_) => return status_only(grpc::DEADLINE_EXCEEDED, "the request did not arrive"),
        };
        let mut deframer = Deframer::default();
        deframer.push(&body);
        let message = match deframer.next_message() {
            Ok(Some(message)) if !deframer.is_partway() => message,
            Ok(_) => return status_only(grpc::INVALID_ARGUMENT, "not one whole message"),
            Err(e) => return status_only(grpc::INVALID_ARGUMENT, &e),
        };
        let request = match proto::RateLimitRequest::decode(message.as_slice()) {
            Ok(request) => request,
            Err(e) => return status_only(grpc::INVALID_ARGUMENT, &format!("unreadable: {e}")),
        };
        log::trace!("rate limit call: {request:?}");
        let Some(limits) = self.limits() else {
            return status_only(grpc::UNAVAILABLE, "no rate limit configuration loaded");
        };
        match self.service.answer(&limits, engine, &request).await {
            Ok(response) => {
                let frames = [
                    Frame::data(Bytes::from(prefixed(&response.encode_to_vec()))),
                    grpc::trailers(grpc::OK, ""),
                ];
                let body = StreamBody::new(stream::iter(frames.map(Ok::<_, Infallible>)));
                grpc_reply(body.boxed_unsync())
            }
            Err(Refusal::Invalid(why)) => status_only(grpc::INVALID_ARGUMENT, &why),
            Err(Refusal::Failed(why)) => {
                log::warn!("rate limit call failed: {why}");
                status_only(grpc::UNAVAILABLE, &why)
            }
        }
    }
}

/// The configuration at `path`, read on a blocking thread: never on the runtime that
/// serves, where a costly file (the parser's time grows with the square of its depth)
/// stalled every check and `/healthz` with `--threads 1`.
async fn read(path: PathBuf, merge: bool) -> Result<Limits, String> {
    tokio::task::spawn_blocking(move || source::load(&path, merge))
        .await
        .unwrap_or_else(|e| Err(format!("the reading stopped: {e}")))
}

fn grpc_reply(body: UnsyncBoxBody<Bytes, Infallible>) -> Reply {
    let mut reply = Response::new(body);
    reply
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    reply
}

/// A call ended without an answer: gRPC's trailers-only response.
fn status_only(status: u32, why: &str) -> Reply {
    let mut reply = grpc_reply(Empty::new().boxed_unsync());
    if let Ok(trailers) = grpc::trailers(status, why).into_trailers() {
        reply.headers_mut().extend(trailers);
    }
    reply
}
