//! The proxy-wasm binding: a root context per worker and an HTTP context per request, both
//! handing their events to the worker's dispatcher (`crate::worker::dispatch`) and
//! carrying out what it decides.
//!
//! The decisions are plain Rust; this module only moves bytes and calls between them and
//! the host. Host calls go through the raw ABI (`abi`, which declares every host function
//! the filter imports) so that every host status is handled instead of unwrapped: a panic
//! would kill the VM and every request of its worker.

mod abi;
mod executor;
mod link;
mod proxy;
#[cfg(feature = "redis-call")]
mod redis;
mod request;
mod root;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use root::Root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(Root::new(id)) });
}}
