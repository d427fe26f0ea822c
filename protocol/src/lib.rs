//! The wire format between ratelimit.wasm and ratelimit-bridge, written once for both.
//!
//! # Layout
//!
//! Bottom to top: each module uses only modules listed before it, tests aside.
//!
//! - `bounds`: every bound of the format, derived from each other.
//! - `number`: decimal numbers without `core::fmt`, cheap in wasm.
//! - `split`: text split at one ASCII byte, cheaper than `str::split` for short fields.
//! - `key`: the grammar of bucket keys, `prefix:rule[:value...]`: what the filter writes
//!   and the bridge accepts.
//! - `id`: the grammar of the ids naming a settlement or a slot.
//! - `global`: a region-spanning rule's terms (`^home,share,ttl_ms`), and the grammar of
//!   region names.
//! - `slot`: an in-flight rule's slot (`|ttl_ms|id`).
//! - `calendar`: a calendar quota's period in a time zone (`&period@zone`).
//! - `request`: the request side: one line per check, encoded by the filter, parsed
//!   strictly by the bridge.
//! - `reply`: the reply side: one line per check, rendered by the bridge, decoded strictly
//!   by the filter.
//! - `bucket`: the token bucket's exact integer arithmetic (`Shape`, `gcd`).
//! - `stream`: the stream transport's envelope, the exchange id before each batch.
//! - `grpc_frame`: gRPC's framing of each message, for whoever reads the stream's bytes.
//! - `script`: the token bucket script's calling convention, for the bridge and the
//!   filter's redis-call build alike.
//!
//! # The format
//!
//! An *exchange* carries a batch of one or more *checks* (one per paused request), each
//! with its rules; the reply answers every check on its own line, in order. Two transports
//! carry the same batch:
//!
//! - **HTTP** (`POST /v1/check`, HTTP/1.1 or h2c): the body is the batch, the reply body
//!   the answer. For hosts without gRPC streams (Kong dispatches HTTP/1.1 only).
//! - **gRPC stream** (`/ratelimit.v1.Bridge/Check`, one long-lived bidi stream per
//!   worker): each message is the exchange id, `\n`, then the batch; each reply message is
//!   the same id, `\n`, then the answer. Replies may come in any order.
//!
//! Request, one line per check, each rule `key,burst,num,den,cost`, and for a rule that
//! blocks repeat offenders `,after,within_ms,for_ms`; rules separated by one space:
//! ```text
//! rl:per-user:alice,100,1,600,1 rl:global,50000,50,1,1
//! rl:login:10.0.0.7,5,1,12000,1,10,60000,900000
//! rl:global,50000,50,1,1+100
//! + rl:global,50000,50,1,37
//! ```
//! A cost written `1+100` also asks for a lease: up to 100 tokens more, if the bucket holds
//! them once the check is admitted; `0+100` asks for the lease alone (a worker topping up
//! its lease ahead of need). A rule ending `^home,share,ttl_ms` is *global*: one budget
//! across regions, kept by the ledger of its home region (`global`). A rule ending `|ttl_ms|id`
//! is an in-flight rule's: its key names a set of at most `burst` slots, and the request's slot
//! `id` is taken by a check (`slot`). A line starting `+ ` returns tokens: each rule's cost
//! is given back (what a lease did not use), or its slot released.
//! Reply, one line per check: the Redis time in ms, then per rule
//! `flag,remaining,full_ms,wait_ms` where the flag is `1` (allowed), `0` (denied) or `b`
//! (denied, the client is blocked: `wait_ms` is the rest of the block), then `,leased` for
//! an allowed rule that was granted a lease of that many tokens; or `!` and a reason for a check the bridge could not
//! run (Redis failed: a backend failure), or `?` and a reason for a check it would not run
//! (the check's own fault, such as a key outside the bridge's prefixes: it must never count
//! against the backend). Either way that check alone fails:
//! ```text
//! 1767225600000 1,99,600,0 1,49999,1,0
//! ! redis unavailable
//! ? key outside the allowed prefixes
//! ```
//! A check is all-or-nothing: either every rule was allowed and charged, or none was.
//! Plain ASCII keeps encoding and decoding cheap in wasm, where it runs on every request.
//!
//! `key` is the grammar of the keys themselves: what the filter writes and the bridge
//! accepts (`prefix:rule[:value...]`).
//!
//! `script` is the other interface written once: how the token bucket script is called on
//! Redis and its reply read, by the bridge and by the filter's redis-call build alike.

mod bounds;
mod bucket;
pub mod calendar;
pub mod global;
mod grpc_frame;
mod id;
pub mod key;
mod number;
mod reply;
mod request;
pub mod script;
pub mod slot;
mod split;
mod stream;

pub use bounds::*;
pub use bucket::{gcd, signed, Level, Shape};
pub use grpc_frame::{prefixed, Deframer};
pub use number::{push_u64, u64_digits, u64_string};
pub use reply::{decode_reply, render_reply, BadReply, CheckResult, RuleResult};
pub use request::{
    encode_rule, end_check, parse_batch, start_lease_return, start_settlement, valid_settlement_id,
    BadBatch, Block, Line, LineKind, Overridden, RuleSpec, RuleSpecRef, Settle, LEASE_RETURN_MARK,
    MAX_SETTLEMENT_ID_LEN, SETTLEMENT_MARK,
};
pub use stream::{split_message, stream_message};

/// The path of the HTTP transport.
pub const PATH: &str = "/v1/check";
/// The gRPC service and method of the stream transport (path `/SERVICE/METHOD`).
pub const GRPC_SERVICE: &str = "ratelimit.v1.Bridge";
pub const GRPC_METHOD: &str = "Check";
