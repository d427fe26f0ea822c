//! The decision: what becomes of a planned request (admitted, denied with a 429, refused
//! for a block, or left to the failure mode), and what its client is shown.
//!
//! A layer of its own because the decision is the filter's contract with the client, and
//! all of it is plain Rust over the plan (`request`), the results the wire brings back
//! (`wire`) and the host's clock and shared data (`host`): no event loop and no transport,
//! so every verdict is unit-tested natively. How checks wait, travel and come back is
//! `worker`'s.
//!
//! Bottom to top: what a worker keeps to decide without the bridge (`breaker`,
//! `deny_cache`, `lease`), the counts of what was decided (`counters`), the failure mode's
//! own buckets (`local`), a metered request's reservation and settlement (`metered`), the
//! ids and lines of an in-flight rule's slots (`slots`),
//! what the client sees (`shown`, `ietf`, `response`), and
//! `admission`, one request's admission from its plan to its verdict (`admission::conclusion`:
//! how an exchange ends; `admission::shortcuts`: what a worker decides without the bridge).

pub mod admission;
pub mod breaker;
pub mod counters;
pub mod deny_cache;
pub mod ietf;
pub mod lease;
pub mod local;
pub mod metered;
pub mod quota;
pub mod response;
pub mod shown;
pub mod slots;
