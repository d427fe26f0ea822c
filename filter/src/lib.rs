//! ratelimit.wasm: global token-bucket rate limiting for Envoy, Istio and Kong.
//!
//! Everything but `glue` is host-independent Rust that compiles and unit-tests natively;
//! `glue` binds it to the proxy-wasm ABI and only exists in the wasm build.

pub mod backend;
pub mod block;
pub mod breaker;
pub mod check;
pub mod config;
pub mod config_error;
pub mod counters;
pub mod deny_cache;
pub mod digest;
pub mod exchange;
#[cfg(test)]
pub(crate) mod fakes;
pub mod header_map;
pub mod host;
pub mod identity;
pub mod ietf;
pub mod jwt;
pub mod lease;
pub mod limit;
pub mod loading;
pub mod local;
pub mod matcher;
pub mod path;
pub mod protocol;
pub mod redis_call;
pub mod response;
pub mod rules;
pub mod scope;
pub mod shown;
pub mod source;

#[cfg(target_arch = "wasm32")]
mod glue;
