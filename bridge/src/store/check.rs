//! A check as the store runs it: the rules of one request, checked all-or-nothing, and
//! its outcome. The shapes come from the `ratelimit-protocol` crate; this module names
//! them for the bridge, below both the store (which runs checks) and the wire (which
//! reads them from an exchange).

pub use ratelimit_protocol::{RuleResult as RuleOutcome, RuleSpec};

/// One request's rules, checked all-or-nothing.
pub type Check = Vec<RuleSpec>;

/// The outcome of one check: Redis time and per-rule outcomes, or why it failed.
pub type CheckOutcome = Result<(u64, Vec<RuleOutcome>), String>;
