//! ratelimit-bridge: a stateless service that runs ratelimit.wasm's checks as atomic Lua
//! script calls on Redis or Valkey, reached over HTTP or one gRPC stream per gateway worker.
//!
//! # Layout
//!
//! Four folders, bottom to top: each uses only the folders listed before it, and inside
//! each the same holds of its modules, tests aside (`tools/layers.py` keeps them free of
//! cycles); `main.rs` is the command line on top. `docs/architecture.md` follows one
//! exchange through them.
//!
//! - `ops`: what an operator watches and hands in: the bridge's metrics (every layer
//!   records them) and the PEM files its flags name.
//! - `store`: Redis as the bridge uses it: a batch of checks run as token bucket script
//!   calls, one per node, merged with every other exchange's (`store::calls`), on a single
//!   server, a Sentinel group's master or a Cluster (`store::connection`).
//! - `engine`: what every front door shares: one `Engine` holding the store, the regions
//!   (global rules' leases, `engine::regions`) and the operators' overrides in force
//!   (`engine::overrides`), through which every door runs its lines.
//! - `doors`: the front doors: the filter's wire (HTTP and the gRPC stream), Envoy's rate
//!   limit service (`doors::rls`), the admin endpoints, the operator's commands and the
//!   probes, all but the commands on one port (`doors::server`), guarded by
//!   `doors::guards`.

// The server's connection future is deep (a request's path through the rate limit service
// included): proving it `Send` takes the compiler past its default depth of 128.
#![recursion_limit = "256"]

pub mod doors;
pub mod engine;
pub mod ops;
pub mod store;
