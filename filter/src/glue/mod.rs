//! The proxy-wasm binding: a root context per worker that owns the validated configuration,
//! the transport to the bridge (a gRPC stream or HTTP callouts) and the worker's group
//! commit, and an HTTP context per request that pauses while its check is out.
//!
//! The decisions are plain Rust (`check`, `exchange`); this module only moves bytes and
//! calls between them and the host. Host calls go through the raw ABI (`abi`, and the
//! stream's in `transport`) so that every host status is handled instead of unwrapped: a
//! panic would kill the VM and every request of its worker.

mod abi;
mod host;
mod hub;
#[cfg(feature = "redis-call")]
mod redis;
#[cfg(feature = "redis-call")]
mod redis_host;
mod request;
mod root;
mod transport;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use root::Root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(Root::new(id)) });
}}
