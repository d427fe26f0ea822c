//! A native proxy-wasm host (ABI 0.2.1, plus Higress's redis call) on wasmtime, to drive
//! the real `ratelimit.wasm` from `cargo test` without Envoy.
//!
//! All host state lives in the wasmtime `Store` of one [`Host`], so tests run in parallel;
//! every callback's fuel is metered; a guest trap is an error carrying its last log lines.
//!
//! Modules build on those below them only (`tools/layers.py` checks it): `abi`, `error`,
//! `wasm`; the data (`callout`, `grpc`, `queue`, `redis`, held together by `state`) and
//! `live`; `memory`; `hostcalls`; `host`; then what drives a `Host` (`stream`,
//! `grpc_upstream`, `clock`).

pub mod abi;
pub mod callout;
mod clock;
pub mod error;
pub mod grpc;
mod grpc_upstream;
pub mod host;
mod hostcalls;
pub mod live;
mod memory;
pub mod queue;
pub mod redis;
pub mod state;
pub mod stream;
pub mod wasm;

pub use abi::{pairs, Action, LogLevel, MapType, Pair, Status};
pub use callout::{CallResponse, Callout, CalloutState};
pub use error::HarnessError;
pub use grpc::GrpcStream;
pub use host::Host;
pub use hostcalls::wasi::ProcExit;
pub use queue::SharedQueue;
pub use state::{Event, HostState, LocalReply, Stream};
pub use wasm::Wasm;
