//! The rate limit service's configuration from an xDS server, as Envoy Gateway serves it to
//! its managed rate limit service (`CONFIG_TYPE=GRPC_XDS_SOTW`): one long-lived
//! `StreamAggregatedResources` call, state of the world, subscribing to every
//! `RateLimitConfig` for this node. Each response holds every domain; it replaces the
//! configuration in force whole if all of it loads (ACK), and is refused whole, keeping the
//! one in force, if any of it does not (NACK, with the line `check-config` would print).
//! Buckets live in Redis under keys the configuration does not name, so no update loses
//! one. A lost stream is opened again, after 1 s and up to 30 s between tries, asking for
//! the version last accepted.
//!
//! - `proto`: the subscription's and the resource's messages.
//! - `convert`: a resource as the YAML tree it stands for.

pub mod convert;
pub mod proto;

use super::limits::Limits;
use super::Rls;
use crate::doors::grpc;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::client::conn::http2;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message;
use proto::{DiscoveryRequest, DiscoveryResponse, Node, RateLimitConfig, Status, TYPE_URL};
use ratelimit_protocol::{prefixed, Deframer};
use rustls::pki_types::ServerName;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

/// Largest response read: gRPC's default limit, as envoyproxy/ratelimit's client has it.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// HTTP/2 pings on the stream: a server gone without a FIN is noticed and left.
const PING_INTERVAL: Duration = Duration::from_secs(20);

/// Where the configuration comes from.
#[derive(Clone)]
pub struct Server {
    /// `host:port`.
    pub address: String,
    /// The node id the server keys its snapshots on.
    pub node: String,
    /// TLS to the server, and the name its certificate must carry; plaintext without.
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
}

/// Follows `server`'s configuration into `rls` until dropped (aborted).
pub async fn follow(rls: Arc<Rls>, server: Server) {
    let mut accepted = String::new();
    let mut retry = FIRST_RETRY;
    loop {
        let mut answered = false;
        match session(&rls, &server, &mut accepted, &mut answered).await {
            Ok(()) => log::warn!(
                "rate limit service: the xDS server {} ended the stream",
                server.address
            ),
            Err(e) => log::warn!("rate limit service: xDS server {}: {e}", server.address),
        }
        if answered {
            retry = FIRST_RETRY;
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(LAST_RETRY);
    }
}

/// One stream: the subscription, then an ACK or a NACK for each response, until it ends.
async fn session(
    rls: &Arc<Rls>,
    server: &Server,
    accepted: &mut String,
    answered: &mut bool,
) -> Result<(), String> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&server.address))
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (scheme, send) = match &server.tls {
        None => ("http", handshake(tcp).await?),
        Some((connector, name)) => {
            let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), tcp))
                .await
                .map_err(|_| format!("no TLS handshake within {CONNECT_TIMEOUT:?}"))?
                .map_err(|e| format!("TLS: {e}"))?;
            ("https", handshake(tls).await?)
        }
    };
    let (requests, outgoing) = mpsc::channel::<Bytes>(4);
    let body = StreamBody::new(stream::unfold(outgoing, |mut outgoing| async move {
        let message = outgoing.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(message)), outgoing))
    }));
    let call = Request::post(format!("{scheme}://{}{}", server.address, proto::PATH))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body.boxed_unsync())
        .map_err(|e| format!("the call: {e}"))?;
    let ask = |version: &str, nonce: &str, error: Option<Status>| {
        let request = DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(Node {
                id: server.node.clone(),
                user_agent_name: "ratelimit-bridge".into(),
            }),
            type_url: TYPE_URL.into(),
            response_nonce: nonce.to_owned(),
            error_detail: error,
        };
        Bytes::from(prefixed(&request.encode_to_vec()))
    };
    let _ = requests.send(ask(accepted, "", None)).await;
    let mut send = send;
    let response = send
        .send_request(call)
        .await
        .map_err(|e| format!("the call failed: {e}"))?;
    if let Some(status) = response.headers().get("grpc-status") {
        let message = response.headers().get("grpc-message");
        return Err(format!("refused: grpc-status {status:?} {message:?}"));
    }
    if !response.status().is_success() {
        return Err(format!("refused: HTTP {}", response.status()));
    }
    let mut body = response.into_body();
    let mut deframer = Deframer::with_limit(MAX_RESPONSE);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("the stream broke: {e}"))?;
        let frame = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let trailers = frame.into_trailers().unwrap_or_default();
                return Err(format!(
                    "the stream ended: grpc-status {:?} {:?}",
                    trailers.get("grpc-status"),
                    trailers.get("grpc-message")
                ));
            }
        };
        deframer.push(&frame);
        while let Some(message) = deframer.next_message()? {
            *answered = true;
            // Decoded and built on a blocking thread, as a file's configuration is read:
            // never on the runtime that serves.
            let applying = Arc::clone(rls);
            let (nonce, verdict) = tokio::task::spawn_blocking(move || apply(&applying, &message))
                .await
                .unwrap_or_else(|e| (String::new(), Err(format!("not applied: {e}"))));
            let reply = match verdict {
                Ok(version) => {
                    *accepted = version;
                    ask(accepted, &nonce, None)
                }
                Err(why) => {
                    log::error!("rate limit service: kept the configuration in force: {why}");
                    let status = Status {
                        code: grpc::INVALID_ARGUMENT as i32,
                        message: why,
                    };
                    ask(accepted, &nonce, Some(status))
                }
            };
            if requests.send(reply).await.is_err() {
                return Err("the stream closed".into());
            }
        }
    }
    Ok(())
}

async fn handshake<S>(io: S) -> Result<http2::SendRequest<XdsBody>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_INTERVAL)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP/2: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            log::debug!("rate limit service: xDS connection: {e}");
        }
    });
    Ok(send)
}

type XdsBody = UnsyncBoxBody<Bytes, Infallible>;

/// A response applied to `rls`: its nonce, and the version now in force or why it was
/// refused.
fn apply(rls: &Rls, message: &[u8]) -> (String, Result<String, String>) {
    let response = match DiscoveryResponse::decode(message) {
        Ok(response) => response,
        Err(e) => return (String::new(), Err(format!("unreadable response: {e}"))),
    };
    let limits = response
        .resources
        .into_iter()
        .enumerate()
        .map(|(n, resource)| {
            let origin = format!("xDS resource {n}");
            if resource.type_url != TYPE_URL {
                return Err(format!(
                    "{origin}: type {:?}, not {TYPE_URL}",
                    resource.type_url
                ));
            }
            let config = RateLimitConfig::decode(resource.value.as_slice())
                .map_err(|e| format!("{origin}: unreadable: {e}"))?;
            let origin = format!("xDS resource {:?}", config.name);
            let domain = convert::domain(config).map_err(|e| format!("{origin}: {e}"))?;
            Ok((origin, domain))
        })
        .collect::<Result<Vec<_>, String>>()
        .and_then(|domains| Limits::build(domains, rls.merge));
    let verdict = limits.map(|limits| {
        log::info!(
            "rate limit service: {} domain(s) from xDS version {:?}",
            limits.domains(),
            response.version_info
        );
        rls.install(limits);
        response.version_info
    });
    (response.nonce, verdict)
}
