//! How the store reaches Redis: one multiplexed connection to a single server or to the
//! master Redis Sentinels name, or one to a Redis Cluster, with the TLS and credentials the
//! flags give; one script call on one node over it; and the flags themselves.
//!
//! Bottom to top:
//!
//! - `redis_tls`: TLS to Redis: the rustls provider, CA and client certificate files.
//! - `connect`: credentials and TLS for the Redis clients, and the URL as logged.
//! - `sentinel`: asking Redis Sentinels where the master is, their answers read strictly.
//! - `single`: the connection to one server, or to the master the sentinels name.
//! - `backend`: the connection to Redis, single or Cluster, and the commands the store
//!   sends on it.
//! - `script_call`: one token bucket script call on one node, and what its errors mean.
//! - `redis_args`: the flags that say where Redis is and how to reach it (`--redis`, TLS,
//!   credentials), shared by the server, the commands and `--region-redis`, and the store
//!   they name.

pub mod backend;
pub mod connect;
pub mod redis_args;
pub mod redis_tls;
pub mod script_call;
pub mod sentinel;
pub mod single;
