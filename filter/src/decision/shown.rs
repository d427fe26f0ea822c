//! The rule whose numbers a response shows the client (the most restrictive of the
//! request's), with its outcome: what the rate-limit fields and refusals are made from.

use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;

/// The rule whose numbers the client is shown, with its outcome and Redis's clock.
pub struct Shown<'a> {
    pub rule: &'a PlannedRule,
    /// Every rule of the request (`rule` among them): the policies it falls under.
    pub all: &'a [PlannedRule],
    pub result: &'a RuleResult,
    pub now_ms: u64,
}

impl Shown<'_> {
    /// `Retry-After`: whole seconds, at least 1, so clients never retry at once.
    pub fn retry_after_s(&self) -> u64 {
        self.result.wait_ms.div_ceil(1000).max(1)
    }

    /// `X-RateLimit-Limit`: the bucket's size, the client's plan's when the bridge said one
    /// is in force, else the rule's (its tier's).
    pub fn in_force(&self) -> u64 {
        self.result.in_force(self.rule.limit.burst)
    }
}
