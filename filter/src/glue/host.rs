//! The host as the filter's logic sees it (request, clock, shared data), the counters it
//! exposes, and the host calls that carry out a verdict. Every host error is handled here.

use crate::check::{Host, Outcome, Verdict};
use crate::identity::RequestView;
use crate::local::SharedData;
use crate::protocol;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};
use std::time::UNIX_EPOCH;

/// The current (effective) context's request, the clock and shared data.
pub struct ProxyHost;

impl RequestView for ProxyHost {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        hostcalls::get_property(vec!["source", "address"])
            .ok()
            .flatten()
    }
}

impl SharedData for ProxyHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), cas)) => Some((value, cas.unwrap_or(0))),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        hostcalls::set_shared_data(key, Some(value), (cas != 0).then_some(cas)).is_ok()
    }
}

impl Host for ProxyHost {
    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The reply to the callout being answered: HTTP status (`None` for a reset or a timeout
/// without one) and body, bounded.
pub fn callout_reply(num_headers: usize, body_size: usize) -> (Option<u32>, Vec<u8>) {
    // A reset callout comes back with no headers, and then Envoy has no reply map at
    // all: reading it answers BadArgument, on which the SDK panics. Don't ask.
    let status = (num_headers > 0)
        .then(|| hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status"))
        .and_then(|r| r.ok().flatten())
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok());
    let size = body_size.min(protocol::MAX_REPLY_LEN + 1);
    let body = (size > 0)
        .then(|| hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size))
        .and_then(|r| r.ok().flatten())
        .unwrap_or_default();
    (status, body)
}

/// Carries out a verdict on the current (effective) request, which is paused.
pub fn carry_out(verdict: &Verdict) {
    match verdict {
        Verdict::Resume => {
            if let Err(e) = hostcalls::resume_http_request() {
                log::warn!("resume failed: {e:?}");
            }
        }
        Verdict::Reply(reply) => {
            let headers: Vec<(&str, &str)> = reply
                .headers
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect();
            if let Err(e) =
                hostcalls::send_http_response(reply.status, headers, Some(reply.body.as_bytes()))
            {
                log::warn!("local reply failed: {e:?}");
            }
        }
    }
}

/// Counters exposed by the host (Envoy: `wasmcustom.ratelimit.*` in `/stats`).
#[derive(Default, Clone, Copy)]
pub struct Metrics {
    callouts: Option<u32>,
    allowed: Option<u32>,
    denied: Option<u32>,
    backend_failures: Option<u32>,
    short_circuits: Option<u32>,
}

impl Metrics {
    pub fn define() -> Metrics {
        let counter = |name| hostcalls::define_metric(MetricType::Counter, name).ok();
        Metrics {
            callouts: counter("ratelimit.callouts"),
            allowed: counter("ratelimit.allowed"),
            denied: counter("ratelimit.denied"),
            backend_failures: counter("ratelimit.backend_failures"),
            short_circuits: counter("ratelimit.short_circuits"),
        }
    }

    fn bump(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn callout(&self) {
        Metrics::bump(self.callouts);
    }

    pub fn count(&self, outcome: Option<Outcome>) {
        Metrics::bump(match outcome {
            Some(Outcome::Allowed) => self.allowed,
            Some(Outcome::Denied) => self.denied,
            Some(Outcome::BackendFailed) => self.backend_failures,
            Some(Outcome::ShortCircuited) => self.short_circuits,
            None => None,
        });
    }
}
