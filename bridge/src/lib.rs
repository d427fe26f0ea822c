//! ratelimit-bridge: a stateless HTTP service that runs ratelimit.wasm's checks as one
//! atomic Lua script call each on Redis or Valkey.

pub mod server;
pub mod slot;
pub mod store;
pub mod wire;
