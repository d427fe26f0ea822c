//! gRPC streams (`proxy_grpc_stream` & co): what the guest opened and sent, and what the
//! world answers, delivered the way Envoy 1.40 delivers it.
//!
//! Envoy owns every stream by the root context: callbacks carry the root's id whichever
//! context opened it. A token stays in Envoy's table until both ends are closed: after the
//! upstream closes, sends still return `Ok` (and go nowhere) until the guest closes or
//! cancels the token; after the guest half-closes, the upstream may still answer and close.
//!
//! This is the streams' state; `grpc_upstream` plays the upstream that answers on them.

use crate::abi::Pair;

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
