//! ratelimit.wasm: global token-bucket rate limiting for Envoy, Istio, Kong and Higress.
//!
//! The configuration (its types, parser and validation, limits, bucket keys) is the
//! `ratelimit-config` crate, which the bridge shares; this crate is the runtime that reads
//! it.
//!
//! # Layout
//!
//! Bottom to top: each module uses only modules listed before it, tests aside
//! (`tools/layers.py` keeps them free of cycles). `docs/architecture.md` follows one
//! request through them.
//!
//! - `host`: the host boundary, three small traits (`RequestView`, `SharedData`, `Proxy`)
//!   that the glue implements over the ABI and the unit tests over `fakes`.
//! - `header_map`: the ABI's serialized header map, every value of every header, read in
//!   place.
//! - `jwt`: one claim out of a JWT payload, trusting nothing about its shape.
//! - `matcher`: whether a rule's `match` covers a request: paths, and methods as the
//!   upstream serves them.
//! - `scope`: which of Higress's `matchRules` entries (`_rules_`) a request falls in.
//! - `breaker`: the circuit breaker, one per worker.
//! - `deny_cache`: buckets known to lack a cost, and blocked clients, per worker.
//! - `lease`: a worker's leases of hot buckets.
//! - `identity`: who is calling: hostile request data into bounded, key-safe values.
//! - `rules`: which rules apply to a request, and the bucket each checks (`rules::plan`).
//! - `protocol`: the filter's side of the wire format: a planned check as one line.
//! - `shown`: the rule whose numbers a response shows.
//! - `ietf`: the IETF draft-11 `RateLimit-Policy` and `RateLimit` fields.
//! - `response`: what the client sees: the headers, the 429, the 503, the 400.
//! - `counters`: the filter's counters, global and per rule, flushed once per tick.
//! - `local`: `failure_mode: "local"`'s buckets in the host's shared data.
//! - `exchange`: group commit: a worker's exchanges in flight and checks waiting.
//! - `check`: one request's check, from its rules to its verdict (`check::settle`: how an
//!   exchange ends; `check::shortcuts`: what a worker decides without the bridge).
//! - `redis_call`: the redis-call build's side of Redis: a batch as one RESP `EVALSHA`.
//! - `dispatch`: a worker's dispatcher, owning everything a worker keeps across requests
//!   and configurations; events in (headers, replies, the stream closed, ticks), verdicts
//!   and `dispatch::Link` calls out.
//! - `glue` (the wasm build only): the proxy-wasm binding, a root context per worker and an
//!   HTTP context per request that hand their events to the dispatcher (`root`, `request`,
//!   `host`, `link`, `abi`, and `redis` in the redis-call build).
//! - `fakes` (tests only): the unit tests' stand-ins for the host, and the example
//!   configuration and planned rules they feed the code.
//!
//! Everything but `glue` is host-independent Rust that compiles and unit-tests natively;
//! `glue` binds it to the proxy-wasm ABI and only exists in the wasm build.

pub mod breaker;
pub mod check;
pub mod counters;
pub mod deny_cache;
pub mod dispatch;
pub mod exchange;
#[cfg(test)]
pub(crate) mod fakes;
pub mod header_map;
pub mod host;
pub mod identity;
pub mod ietf;
pub mod jwt;
pub mod lease;
pub mod local;
pub mod matcher;
pub mod protocol;
pub mod redis_call;
pub mod response;
pub mod rules;
pub mod scope;
pub mod shown;

#[cfg(target_arch = "wasm32")]
mod glue;
