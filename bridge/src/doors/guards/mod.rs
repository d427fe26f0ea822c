//! What guards the bridge's port, whichever door a request is for: who may come in (the
//! gateways' and the operators' tokens, TLS), how many at once (the connection slots), for
//! how long (the deadlines), and holding how much memory between them (the budget).
//!
//! - `budget`: one bound on the memory of every exchange at once (`--max-pending-mib`).
//! - `slots`: the connection slots (`--max-connections`), and who gives one up.
//! - `deadlines`: what one connection may hold (`ConnectionBounds`): header, body and
//!   write deadlines.
//! - `access`: who may check (the gateways' token) and who may change limits.
//! - `listen_tls`: TLS on the bridge's own port (`--tls-cert`), mutual with
//!   `--tls-client-ca`.

pub mod access;
pub mod budget;
pub mod deadlines;
pub mod listen_tls;
pub mod slots;
