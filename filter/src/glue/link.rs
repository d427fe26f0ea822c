//! The dispatcher's `Link` over the host: the worker's gRPC stream, HTTP callouts,
//! Higress's redis call (the redis-call build), the wake-up queue, the tick and the
//! metrics. Every host status comes back as an error, never a panic.

use super::abi;
use crate::wire::redis_call::Invoke;
use crate::wire::{self, GRPC_METHOD, GRPC_SERVICE};
use crate::worker::dispatch::Link;
use proxy_wasm::hostcalls;
use ratelimit_config::backend::Backend;
use std::time::Duration;

/// The host, as the dispatcher sends through it; `queue` is the worker's wake-up queue.
#[derive(Default)]
pub(super) struct HostLink {
    pub(super) queue: Option<u32>,
}

impl Link for HostLink {
    fn stream_send(&mut self, token: u32, id: u32, body: &str) -> Result<(), String> {
        let message = wire::stream_message(id, body);
        abi::grpc_send(token, message.as_bytes()).map_err(|s| format!("stream send failed: {s:?}"))
    }

    fn callout(&mut self, backend: &Backend, body: &str) -> Result<u32, String> {
        let (headers, body) = (wire::callout_headers(backend), Some(body.as_bytes()));
        let timeout = Duration::from_millis(backend.timeout_ms);
        hostcalls::dispatch_http_call(&backend.cluster, headers, body, vec![], timeout)
            .map_err(|e| format!("dispatch failed: {e:?}"))
    }

    #[cfg(feature = "redis-call")]
    fn redis_call(&mut self, backend: &Backend, body: &str, invoke: Invoke) -> Result<u32, String> {
        let query = crate::wire::redis_call::script_query(body, invoke)?;
        abi::redis_call(&backend.cluster, &query)
            .map_err(|status| format!("proxy_redis_call failed (status {status})"))
    }

    // This build refuses a configuration with the redis transport before any check.
    #[cfg(not(feature = "redis-call"))]
    fn redis_call(&mut self, _: &Backend, _: &str, _: Invoke) -> Result<u32, String> {
        Err("this build has no redis call".into())
    }

    /// Through the SDK, which must learn the token to route the stream's events.
    fn open_stream(&mut self, backend: &Backend) -> Result<u32, String> {
        let metadata = wire::stream_metadata(backend);
        hostcalls::open_grpc_stream(&backend.cluster, GRPC_SERVICE, GRPC_METHOD, metadata)
            .map_err(|e| format!("cannot open a gRPC stream on {:?}: {e:?}", backend.cluster))
    }

    fn close_stream(&mut self, token: u32) {
        let _ = abi::grpc_close(token);
    }

    fn post_wake(&mut self) -> bool {
        self.queue
            .is_some_and(|queue| abi::enqueue(queue, b"w").is_ok())
    }

    fn set_tick(&mut self, period: Duration) {
        let _ = abi::set_tick_period(period);
    }

    fn define_counter(&mut self, name: &str) -> Option<u32> {
        abi::define_counter(name)
    }

    fn add_to_counter(&mut self, id: u32, n: u64) {
        if let Ok(n) = i64::try_from(n) {
            let _ = abi::increment_metric(id, n);
        }
    }
}

/// Registers this worker's wake-up queue: a shared queue whose name no other worker uses,
/// since the host notifies only the last context to register a name. Call from a root
/// callback. `None` where the host has no shared queues: the dispatcher wakes with a tick.
pub(super) fn register_wake_queue() -> Option<u32> {
    use std::hash::{BuildHasher, Hasher};
    let unique = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    abi::register_queue(&format!("ratelimit.wake.{unique:016x}"))
}
