//! ratelimit-bridge: a stateless service that runs ratelimit.wasm's checks as atomic Lua
//! script calls on Redis or Valkey, reached over HTTP or one gRPC stream per gateway worker.
//!
//! # Layout
//!
//! Bottom to top: each module uses only modules listed before it, tests aside
//! (`tools/layers.py` keeps them free of cycles); `main.rs` is the command line on top.
//! `docs/architecture.md` follows one exchange through them.
//!
//! - `check`: a check as the store runs it (one request's rules) and its outcome. The
//!   script's calling convention, shared with the filter, is `ratelimit_protocol::script`.
//! - `slot`: Redis Cluster key slots.
//! - `topology`: a Cluster's slot map: which node serves each slot.
//! - `commit`: group commit across every gateway: one lane of calls per node and mode.
//! - `batch`: a batch of checks into script calls per node: own buckets first, shared after.
//! - `tally`: the calls' answers gathered per check, and what must be given back.
//! - `global_metrics`: the series of global rules' leases, registered with the others.
//! - `metrics`: the Prometheus registry behind `GET /metrics`.
//! - `keyspace`: the keys the bridge may touch: its prefixes, and the keys' grammar.
//! - `overrides`: what an emergency override is, its records, the table that applies them.
//! - `override_cache`: the overrides in force, and the bound on their staleness.
//! - `pem`: PEM files named by flags (certificates, keys, CA bundles), checked at startup.
//! - `redis_tls`: TLS to Redis: the rustls provider, CA and client certificate files.
//! - `connect`: credentials and TLS for the Redis clients, and the URL as logged.
//! - `sentinel`: asking Redis Sentinels where the master is, their answers read strictly.
//! - `single`: the connection to one server, or to the master the sentinels name.
//! - `backend`: the connection to Redis, and one script call on one node.
//! - `slot_map`: the slot map a store plans with, read again when a slot moved.
//! - `store`: a batch run on a single Redis, a Sentinel group's master or a Cluster, every
//!   check all-or-nothing.
//! - `redis_memory`: the warning about a `maxmemory` policy that fails checks or evicts
//!   overrides.
//! - `health`: the background ping that reconnects to a Redis that is back.
//! - `redis_args`: the flags that say where Redis is and how to reach it (`--redis`, TLS,
//!   credentials), shared by the server, the commands and `--region-redis`.
//! - `regions`: global rules: one budget across regions, a home ledger's tokens spent
//!   through leases this bridge holds (`holder`, `ledger`, `flags`).
//! - `wire`: one exchange: a batch in, its answer out, for both transports.
//! - `budget`: one bound on the memory of every exchange at once (`--max-pending-mib`).
//! - `slots`: the connection slots (`--max-connections`), and who gives one up.
//! - `deadlines`: what one connection may hold (`ConnectionBounds`): header, body and
//!   write deadlines.
//! - `access`: who may check (the gateways' token) and who may change limits.
//! - `listen_tls`: TLS on the bridge's own port (`--tls-cert`), mutual with
//!   `--tls-client-ca`.
//! - `grpc`: the stream transport, one long-lived gRPC stream per gateway worker.
//! - `registry`: overrides in Redis: set, clear, list, and the refresh every 250 ms.
//! - `usage`: a client's bucket, read without spending or writing anything (`read`).
//! - `unblock`: lifting a rule's block (`lua/unblock.lua`).
//! - `admin`: the `/admin/` endpoints, behind the operators' secret.
//! - `probes`: health and metrics, on the bridge's port and on plaintext probe ports of
//!   their own (`--probe-listen`).
//! - `rls_metrics`: the rate limit service's per-limit series, registered with the others.
//! - `rls`: Envoy's Rate Limit Service (`ShouldRateLimit`), read from envoyproxy/ratelimit's
//!   YAML and answered from the same buckets (`--rls-config`).
//! - `server`: the network side: every endpoint on one port, and graceful shutdown.
//! - `commands`: the `override`, `unblock` and `usage` commands.
//! - `fakes` (tests only): the unit tests' shared rule and two-node slot map.

// The server's connection future is deep (a request's path through the rate limit service
// included): proving it `Send` takes the compiler past its default depth of 128.
#![recursion_limit = "256"]

pub mod access;
pub mod admin;
pub mod backend;
pub mod batch;
pub mod budget;
pub mod check;
pub mod commands;
pub mod commit;
pub mod connect;
pub mod deadlines;
pub mod engine;
#[cfg(test)]
pub(crate) mod fakes;
pub mod global_metrics;
pub mod grpc;
pub mod health;
pub mod keyspace;
pub mod listen_tls;
pub mod metrics;
pub mod override_cache;
pub mod overrides;
pub mod pem;
pub mod probes;
pub mod redis_args;
pub mod redis_memory;
pub mod redis_tls;
pub mod regions;
pub mod registry;
pub mod rls;
pub mod rls_metrics;
pub mod sentinel;
pub mod server;
pub mod single;
pub mod slot;
pub mod slot_map;
pub mod slots;
pub mod store;
pub mod tally;
pub mod topology;
pub mod unblock;
pub mod usage;
pub mod wire;
