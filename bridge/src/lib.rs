//! ratelimit-bridge: a stateless service that runs ratelimit.wasm's checks as atomic Lua
//! script calls on Redis or Valkey, reached over HTTP or one gRPC stream per gateway worker.

pub mod access;
pub mod admin;
pub mod backend;
pub mod batch;
pub mod budget;
pub mod check;
pub mod commands;
pub mod commit;
pub mod connect;
pub mod grpc;
pub mod health;
pub mod keyspace;
pub mod limits;
pub mod metrics;
pub mod override_cache;
pub mod overrides;
pub mod redis_memory;
pub mod redis_tls;
pub mod registry;
pub mod script;
pub mod sentinel;
pub mod server;
pub mod single;
pub mod slot;
pub mod slots;
pub mod store;
pub mod tally;
pub mod topology;
pub mod unblock;
pub mod usage;
pub mod wire;
