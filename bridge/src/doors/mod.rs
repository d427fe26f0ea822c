//! The front doors: every way a request reaches the bridge, each reading its callers'
//! input, running what it asks through the engine (`crate::engine`), and answering in its
//! own terms. The gateways' filter comes through the wire (`POST /v1/check` or one gRPC
//! stream per worker), Envoy's own `ratelimit` filter through the rate limit service, the
//! operators through the admin endpoints or the commands, and orchestrators through the
//! probes; all but the commands on one port (`server`), behind its guards (`guards`).
//!
//! Bottom to top:
//!
//! - `guards`: who may come in, how many at once, for how long, holding how much.
//! - `wire`: one exchange: a batch in, its answer out, for both of the filter's transports.
//! - `grpc`: the stream transport, one long-lived gRPC stream per gateway worker.
//! - `rls`: Envoy's Rate Limit Service (`ShouldRateLimit`), read from envoyproxy/ratelimit's
//!   YAML and answered from the same buckets (`--rls-config`).
//! - `probes`: health and metrics, on the bridge's port and on plaintext probe ports of
//!   their own (`--probe-listen`).
//! - `http`: the callout transport, `POST /v1/check`.
//! - `usage`: a client's bucket, read without spending or writing anything (`read`).
//! - `admin`: the `/admin/` endpoints, behind the operators' secret.
//! - `server`: every door but the commands on one port, and graceful shutdown.
//! - `commands`: the `override`, `unblock`, `usage` and `check-config` commands;
//!   `plan_commands`: the `plan` commands; `command_args`: what both take (where, which
//!   buckets).

pub mod admin;
pub mod command_args;
pub mod commands;
pub mod grpc;
pub mod guards;
pub mod http;
pub mod plan_commands;
pub mod probes;
pub mod rls;
pub mod server;
pub mod usage;
pub mod wire;
