//! The real `dist/ratelimit.wasm` driven through the harness: one test binary, so the
//! module is compiled once for all of them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
mod config;
mod decisions;
mod envoy;
mod failures;
mod group_commit;
mod identity;
mod live;
mod redis;
mod redis_failures;
mod redis_slots;
mod refused;
mod stack;
mod stream;
