//! ratelimit.wasm: global token-bucket rate limiting for Envoy, Istio, Kong and Higress.
//!
//! The configuration (its types, parser and validation, limits, bucket keys) is the
//! `ratelimit-config` crate, which the bridge shares; this crate is the runtime that reads
//! it.
//!
//! # Layout
//!
//! Bottom to top, a folder per layer: each module uses only modules listed before it,
//! tests aside (`tools/layers.py` keeps them free of cycles, inside each folder too).
//! `docs/architecture.md` follows one request through them.
//!
//! - `host` (`host/`): the host boundary, three small traits (`RequestView`, `SharedData`,
//!   `Proxy`) that the glue implements over the ABI and the unit tests over `fakes`.
//!   - `header_map`: the ABI's serialized header map, every value of every header, read
//!     in place.
//! - `request` (`request/`): what a request asks for: who is calling and which rules
//!   apply.
//!   - `jwt`: one claim out of a JWT payload, trusting nothing about its shape.
//!   - `matcher`: whether a rule's `match` covers a request: paths, and methods as the
//!     upstream serves them.
//!   - `scope`: which of Higress's `matchRules` entries (`_rules_`) a request falls in.
//!   - `identity`: who is calling: hostile request data into bounded, key-safe values.
//!   - `rules`: which rules apply to a request, and the bucket each checks
//!     (`request::rules::plan`).
//! - `metering` (`metering/`): what a metered rule's response cost, read from its body
//!   as it passes (an LLM API's `usage` token counts, in JSON or server-sent events),
//!   in fixed memory and without holding back a byte.
//!   - `paths`: the field paths a rule reads, compiled into masks.
//!   - `find`: the next byte that matters, eight bytes at a time.
//!   - `number`: a JSON number's grammar, and whether it is a usable count.
//!   - `key`: a JSON string's escapes, and the key kept of it for comparison.
//!   - `json`: a streaming JSON scanner that follows the structure and records the
//!     numbers at those paths.
//!   - `events`: server-sent events framing, each event's data handed to the scanner.
//! - `wire` (`wire/`): the filter's side of the wire format (the `ratelimit-protocol`
//!   crate): a planned check as one line.
//!   - `redis_call`: the redis-call build's side of Redis: a batch as one RESP `EVALSHA`.
//! - `decision` (`decision/`): what becomes of a planned request, and what the client
//!   sees.
//!   - `breaker`: the circuit breaker, one per worker.
//!   - `deny_cache`: buckets known to lack a cost, and blocked clients, per worker.
//!   - `lease`: a worker's leases of hot buckets.
//!   - `counters`: the filter's counters, global and per rule, flushed once per tick.
//!   - `local`: `failure_mode: "local"`'s buckets in the host's shared data.
//!   - `shown`: the rule whose numbers a response shows.
//!   - `ietf`: the IETF draft-11 `RateLimit-Policy` and `RateLimit` fields.
//!   - `response`: what the client sees: the headers, the 429, the 503, the 400.
//!   - `admission`: one request's admission, its check from its rules to its verdict
//!     (`admission::conclusion`: how an exchange ends; `admission::shortcuts`: what a worker
//!     decides without the bridge).
//! - `worker` (`worker/`): a worker's events, and the exchanges its checks travel in.
//!   - `exchange`: group commit: a worker's exchanges in flight and checks waiting.
//!   - `dispatch`: a worker's dispatcher, owning everything a worker keeps across requests
//!     and configurations; events in (headers, replies, the stream closed, ticks),
//!     verdicts and `dispatch::Link` calls out.
//! - `glue` (`glue/`, the wasm build only): the proxy-wasm binding, a root context per
//!   worker and an HTTP context per request that hand their events to the dispatcher
//!   (`root`, `request`, `proxy`, `executor`, `link`, `abi`, and `redis` in the
//!   redis-call build).
//! - `fakes` (tests only): the unit tests' stand-ins for the host, the example
//!   configuration and planned rules they feed the code, and the builders the check's
//!   tests share.
//!
//! Everything but `glue` is host-independent Rust that compiles and unit-tests natively;
//! `glue` binds it to the proxy-wasm ABI and only exists in the wasm build.

pub mod decision;
#[cfg(test)]
pub(crate) mod fakes;
pub mod host;
pub mod metering;
pub mod request;
pub mod wire;
pub mod worker;

#[cfg(target_arch = "wasm32")]
mod glue;
