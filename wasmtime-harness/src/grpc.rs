//! gRPC streams (`proxy_grpc_stream` & co): what the guest opened and sent, and what the
//! world answers, delivered the way Envoy 1.40 delivers it.
//!
//! Envoy owns every stream by the root context: callbacks carry the root's id whichever
//! context opened it. A token stays in Envoy's table until both ends are closed: after the
//! upstream closes, sends still return `Ok` (and go nowhere) until the guest closes or
//! cancels the token; after the guest half-closes, the upstream may still answer and close.

use crate::abi::{pairs, Pair};
use crate::error::HarnessError;
use crate::host::Host;
use std::net::SocketAddr;

/// gRPC `UNAVAILABLE`: what Envoy reports when the upstream cannot be reached.
pub const UNAVAILABLE: u32 = 14;

/// One `proxy_grpc_stream` the guest opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcStream {
    pub token: u32,
    /// The context that was running when it was opened (callbacks still go to the root).
    pub context_id: u32,
    /// The cluster the guest named.
    pub upstream: String,
    pub service: String,
    pub method: String,
    pub initial_metadata: Vec<Pair>,
    /// Every message that went on the wire, in order.
    pub messages: Vec<Vec<u8>>,
    /// Messages Envoy answered `Ok` to but could not send: after a half-close or the
    /// upstream's close. A filter that sends these is losing checks.
    pub dropped: Vec<Vec<u8>>,
    /// The guest sent a message with `end_stream` (a half-close).
    pub end_stream_sent: bool,
    /// The guest called `proxy_grpc_close` (a half-close; the upstream may still answer).
    pub guest_closed: bool,
    /// The guest called `proxy_grpc_cancel`: reset, no callback ever again.
    pub guest_cancelled: bool,
    /// The upstream closed it with this gRPC status and message (`grpc_remote_close`).
    pub remote_close: Option<(u32, String)>,
    /// Whether the response headers (initial metadata) reached the guest.
    pub initial_metadata_delivered: bool,
    /// Messages live mode already forwarded.
    pub forwarded: usize,
}

impl GrpcStream {
    /// Whether Envoy still holds the token (a send or close on it is not `NotFound`).
    pub fn held(&self) -> bool {
        // Envoy drops its entry on a cancel, or once both ends are closed.
        let both_closed = self.guest_closed && self.remote_close.is_some();
        !(self.guest_cancelled || both_closed)
    }

    /// Whether a message sent now reaches the upstream.
    pub fn writable(&self) -> bool {
        self.held() && !self.guest_closed && !self.end_stream_sent && self.remote_close.is_none()
    }

    /// Whether the upstream can still send: what a test may deliver.
    pub fn readable(&self) -> bool {
        !self.guest_cancelled && self.remote_close.is_none()
    }

    /// The upstream closed it but the guest never closed the token: Envoy keeps the entry
    /// for the life of the VM.
    pub fn leaked(&self) -> bool {
        self.held() && self.remote_close.is_some()
    }

    pub fn messages_text(&self) -> Vec<String> {
        let text = |m: &Vec<u8>| String::from_utf8_lossy(m).into_owned();
        self.messages.iter().map(text).collect()
    }
}

/// gRPC state of one VM.
#[derive(Debug, Clone)]
pub struct GrpcState {
    pub streams: Vec<GrpcStream>,
    /// Last stream token handed out; Envoy's are 2 mod 4 (HTTP calls 0, gRPC calls 1).
    pub last_token: u32,
    /// Buffer type 5, only while `proxy_on_grpc_receive` runs.
    pub receive: Option<Vec<u8>>,
    /// Map type 4, only while `proxy_on_grpc_receive_initial_metadata` runs.
    pub initial_metadata: Option<Vec<Pair>>,
    /// Map type 5, only while `proxy_on_grpc_receive_trailing_metadata` runs.
    pub trailing_metadata: Option<Vec<Pair>>,
}

impl Default for GrpcState {
    fn default() -> Self {
        GrpcState {
            streams: Vec::new(),
            last_token: 2,
            receive: None,
            initial_metadata: None,
            trailing_metadata: None,
        }
    }
}

impl GrpcState {
    pub fn get_mut(&mut self, token: u32) -> Option<&mut GrpcStream> {
        self.streams.iter_mut().find(|s| s.token == token)
    }

    /// A stream-type token Envoy still holds.
    pub fn held_mut(&mut self, token: u32) -> Option<&mut GrpcStream> {
        self.get_mut(token).filter(|s| s.held())
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The response headers of a gRPC stream, as Envoy's async client sees them.
fn default_initial_metadata() -> Vec<Pair> {
    pairs(&[(":status", "200"), ("content-type", "application/grpc")])
}

impl Host {
    pub fn grpc_streams(&self) -> &[GrpcStream] {
        &self.state().grpc.streams
    }

    pub fn grpc_stream(&self, token: u32) -> Option<&GrpcStream> {
        self.grpc_streams().iter().find(|s| s.token == token)
    }

    /// The stream `context_id` opened last.
    pub fn grpc_stream_of(&self, context_id: u32) -> Option<&GrpcStream> {
        self.grpc_streams()
            .iter()
            .rev()
            .find(|s| s.context_id == context_id)
    }

    fn grpc_stream_mut(&mut self, token: u32) -> Result<&mut GrpcStream, HarnessError> {
        self.state_mut()
            .grpc
            .get_mut(token)
            .ok_or_else(|| HarnessError::Usage(format!("no gRPC stream {token}")))
    }

    /// The stream the upstream may still send on, or a usage error.
    fn readable(&mut self, token: u32) -> Result<&mut GrpcStream, HarnessError> {
        let stream = self.grpc_stream_mut(token)?;
        if !stream.readable() {
            return Err(HarnessError::Usage(format!(
                "gRPC stream {token} cannot receive: cancelled {}, remote close {:?}",
                stream.guest_cancelled, stream.remote_close
            )));
        }
        Ok(stream)
    }

    /// Delivers the response headers of stream `token` (once, before any message), with
    /// `:status: 200` in front as Envoy's map has it.
    pub fn grpc_initial_metadata(
        &mut self,
        token: u32,
        headers: &[(&str, &str)],
    ) -> Result<(), HarnessError> {
        let mut all = pairs(&[(":status", "200")]);
        all.extend(pairs(headers));
        self.deliver_initial_metadata(token, all)
    }

    fn deliver_initial_metadata(
        &mut self,
        token: u32,
        metadata: Vec<Pair>,
    ) -> Result<(), HarnessError> {
        let stream = self.readable(token)?;
        if stream.initial_metadata_delivered {
            return Err(HarnessError::Usage(format!(
                "gRPC stream {token} already has its initial metadata"
            )));
        }
        stream.initial_metadata_delivered = true;
        let n = count(metadata.len());
        self.state_mut().grpc.initial_metadata = Some(metadata);
        let result = self.grpc_callback("proxy_on_grpc_receive_initial_metadata", token, n);
        self.state_mut().grpc.initial_metadata = None;
        result
    }

    /// Delivers one message from the upstream on stream `token` (the first one preceded by
    /// the response headers, as Envoy does when they arrive); the guest reads it as
    /// buffer type 5 during `proxy_on_grpc_receive`.
    pub fn grpc_message(&mut self, token: u32, message: &[u8]) -> Result<(), HarnessError> {
        self.event(|host| {
            if !host.readable(token)?.initial_metadata_delivered {
                host.deliver_initial_metadata(token, default_initial_metadata())?;
                if host.cancelled(token) {
                    return Ok(());
                }
            }
            host.state_mut().grpc.receive = Some(message.to_vec());
            let result = host.grpc_callback("proxy_on_grpc_receive", token, count(message.len()));
            host.state_mut().grpc.receive = None;
            result
        })
    }

    /// The upstream closes stream `token` with gRPC `status` and `message`: trailing
    /// metadata, then `proxy_on_grpc_close` during which `proxy_get_status` answers both.
    /// Before any response headers this is a trailers-only response: Envoy first delivers
    /// empty initial metadata and hands the headers over as the trailers.
    pub fn grpc_remote_close(
        &mut self,
        token: u32,
        status: u32,
        message: &str,
    ) -> Result<(), HarnessError> {
        self.event(|host| {
            let trailers_only = !host.readable(token)?.initial_metadata_delivered;
            if trailers_only {
                host.deliver_initial_metadata(token, Vec::new())?;
                if host.cancelled(token) {
                    return Ok(());
                }
            }
            let mut trailers = if trailers_only {
                default_initial_metadata()
            } else {
                Vec::new()
            };
            trailers.extend(pairs(&[("grpc-status", &status.to_string())]));
            if !message.is_empty() {
                trailers.extend(pairs(&[("grpc-message", message)]));
            }
            // Envoy marks the stream remotely closed before the callbacks run.
            host.readable(token)?.remote_close = Some((status, message.to_owned()));
            let n = count(trailers.len());
            host.state_mut().grpc.trailing_metadata = Some(trailers);
            let result = host.grpc_callback("proxy_on_grpc_receive_trailing_metadata", token, n);
            host.state_mut().grpc.trailing_metadata = None;
            result?;
            if host.cancelled(token) {
                return Ok(());
            }
            host.state_mut().last_status = (status, message.as_bytes().to_vec());
            let result = host.grpc_callback("proxy_on_grpc_close", token, status as i32);
            host.state_mut().last_status = (0, Vec::new());
            result
        })
    }

    /// Whether the guest cancelled `token`, perhaps in a callback: Envoy resets the stream
    /// and delivers nothing more, not even the rest of the event under way.
    fn cancelled(&self, token: u32) -> bool {
        self.grpc_stream(token).is_none_or(|s| s.guest_cancelled)
    }

    /// Runs a stream callback on the root context, as Envoy does.
    fn grpc_callback(
        &mut self,
        name: &'static str,
        token: u32,
        arg: i32,
    ) -> Result<(), HarnessError> {
        let root = self.root_id()?;
        let params = (root as i32, token as i32, arg);
        self.call::<(i32, i32, i32), ()>(name, root, params)
            .map(|_| ())
    }

    /// Live mode: forwards each message the guest sent on stream `token` and not yet
    /// forwarded to the bridge at `addr` (`id\n` + batch → `POST /v1/check`), delivering
    /// `id\n` + the reply body; an unreachable bridge or a non-200 reply closes the stream
    /// with `UNAVAILABLE`. Messages the guest sends meanwhile are forwarded too. Returns how
    /// many replies reached the guest.
    pub fn forward_grpc(&mut self, token: u32, addr: SocketAddr) -> Result<usize, HarnessError> {
        let mut replies = 0;
        loop {
            let stream = self.grpc_stream_mut(token)?;
            if !stream.readable() {
                return Ok(replies);
            }
            let Some(message) = stream.messages.get(stream.forwarded).cloned() else {
                return Ok(replies);
            };
            stream.forwarded += 1;
            let upstream = stream.upstream.clone();
            match crate::live::forward_message(addr, &upstream, &message) {
                Ok(reply) => {
                    self.grpc_message(token, &reply)?;
                    replies += 1;
                }
                Err(reason) => {
                    self.grpc_remote_close(token, UNAVAILABLE, &reason)?;
                    return Ok(replies);
                }
            }
        }
    }
}
