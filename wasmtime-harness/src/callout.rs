//! HTTP callouts (`proxy_http_call`): what the filter asked for, and the replies a test
//! gives back, shaped the way Envoy delivers them.
//!
//! Envoy has two ways to end a callout: a response (including the 503/504 its router makes
//! up when the upstream is unreachable or too slow), or a reset, delivered as a callback
//! with zero headers during which the reply header map does not exist at all.

use crate::abi::{first, Pair};

/// Where a callout stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalloutState {
    Pending,
    Answered {
        status: u32,
    },
    /// Reset (zero headers, zero body), as Envoy's `onHttpCallFailure`.
    Failed,
    /// The timeout passed: Envoy's router answered 504.
    TimedOut,
}

/// One `proxy_http_call` the filter made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    pub token: u32,
    /// The context that dispatched it and gets the reply.
    pub context_id: u32,
    /// The cluster name (Envoy) or `host:port` (Kong).
    pub upstream: String,
    pub headers: Vec<Pair>,
    pub body: Vec<u8>,
    pub trailers: Vec<Pair>,
    pub timeout_ms: u32,
    /// Monotonic time of the dispatch, to time it out when the clock passes the deadline.
    pub dispatched_ns: u64,
    pub state: CalloutState,
}

impl Callout {
    pub fn header(&self, name: &str) -> Option<String> {
        first(&self.headers, name)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Monotonic time past which Envoy gives up on it.
    pub fn deadline_ns(&self) -> u64 {
        self.dispatched_ns
            .saturating_add(u64::from(self.timeout_ms).saturating_mul(1_000_000))
    }
}

/// A reply as the guest reads it during `proxy_on_http_call_response`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallResponse {
    /// Includes `:status`, as Envoy's response header map does.
    pub headers: Vec<Pair>,
    pub body: Vec<u8>,
    pub trailers: Vec<Pair>,
}

impl CallResponse {
    /// A response with `status`, `body`, and the `content-length` Envoy would report.
    pub fn new(status: u32, body: impl Into<Vec<u8>>) -> CallResponse {
        let body = body.into();
        CallResponse {
            headers: vec![
                (b":status".to_vec(), status.to_string().into_bytes()),
                (
                    b"content-length".to_vec(),
                    body.len().to_string().into_bytes(),
                ),
            ],
            body,
            trailers: Vec::new(),
        }
    }

    /// Adds a response header (lower-cased, as Envoy hands them to wasm).
    pub fn header(mut self, name: &str, value: &str) -> CallResponse {
        self.headers.push((
            name.to_ascii_lowercase().into_bytes(),
            value.as_bytes().to_vec(),
        ));
        self
    }

    /// What Envoy's router answers when the callout's timeout passes.
    pub fn envoy_timeout() -> CallResponse {
        CallResponse::new(504, "upstream request timeout").header("content-type", "text/plain")
    }

    /// What Envoy's router answers when it cannot reach the upstream.
    pub fn envoy_unreachable(reason: &str) -> CallResponse {
        let body = format!(
            "upstream connect error or disconnect/reset before headers. reset reason: {reason}"
        );
        CallResponse::new(503, body).header("content-type", "text/plain")
    }

    /// The `:status` as a number.
    pub fn status(&self) -> Option<u32> {
        first(&self.headers, ":status")?.parse().ok()
    }
}
