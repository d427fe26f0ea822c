//! A native proxy-wasm host (ABI 0.2.1, plus Higress's redis call) on wasmtime, to drive
//! the real `ratelimit.wasm` from `cargo test` without Envoy.
//!
//! All host state lives in the wasmtime `Store` of one [`Host`], so tests run in parallel;
//! every callback's fuel is metered; a guest trap is an error carrying its last log lines.
//!
//! # Layout
//!
//! Bottom to top: each module uses only modules listed before it, tests aside
//! (`tools/layers.py` checks that there are no cycles).
//!
//! - `abi`: the numbers and byte layouts of proxy-wasm ABI 0.2.1, as Envoy speaks them.
//! - `error`: what can go wrong driving a guest, worded for a failing test.
//! - `wasm`: finding and compiling the filter once per test file.
//! - `callout`: HTTP callouts: what the guest asked for, and the replies a test gives.
//! - `grpc`: gRPC streams: what the guest opened and sent, and what the world answers.
//! - `queue`: shared queues and the notifications they post.
//! - `redis`: Higress's redis-call ABI.
//! - `state`: everything the host knows, kept in the wasmtime `Store`.
//! - `live`: live mode: callouts forwarded to a real bridge, redis calls to a real Redis.
//! - `memory`: guest memory, touched only through bounds-checked copies.
//! - `hostcalls`: the ABI functions the guest imports, each refusable with a chosen status.
//! - `vm`: a loaded VM (`Host`), its callbacks and the event loop around them.
//! - `stream`: driving HTTP streams through the guest, and delivering callout and redis
//!   replies.
//! - `grpc_upstream`: playing the upstream of the guest's gRPC streams.
//! - `clock`: the virtual clock: what falls due runs in time order.
//!
//! `bin/wasi-run` is the cargo runner that runs the filter's unit tests as wasm32.

pub mod abi;
pub mod callout;
mod clock;
pub mod error;
pub mod grpc;
mod grpc_upstream;
mod hostcalls;
pub mod live;
mod memory;
pub mod queue;
pub mod redis;
pub mod state;
pub mod stream;
pub mod vm;
pub mod wasm;

pub use abi::{pairs, Action, LogLevel, MapType, Pair, Status};
pub use callout::{CallResponse, Callout, CalloutState};
pub use error::HarnessError;
pub use grpc::GrpcStream;
pub use hostcalls::wasi::ProcExit;
pub use queue::SharedQueue;
pub use state::{Event, HostState, LocalReply, Stream};
pub use vm::Host;
pub use wasm::Wasm;
