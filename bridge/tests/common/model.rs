//! The token bucket over a batch, in plain Rust: the buckets of one Redis, each check of a
//! batch applied in order and all-or-nothing, each bucket stepped by the one Rust
//! definition of the arithmetic (`ratelimit_protocol::Shape`), so that
//! `lua/token_bucket.lua` can be held to it.

use ratelimit_bridge::store::check::{RuleOutcome, RuleSpec};
use ratelimit_protocol::{Level, Shape};
use std::collections::HashMap;

/// A bucket's stored state: its level in units at Redis time `at` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub units: i128,
    pub at: u128,
}

/// Every bucket by key; a missing key is a full bucket.
pub type Buckets = HashMap<String, Bucket>;

/// A batch at time `now`: its checks one after the other, as the script applies them.
pub fn batch(state: &mut Buckets, checks: &[Vec<RuleSpec>], now: u128) -> Vec<Vec<RuleOutcome>> {
    checks.iter().map(|c| check(state, c, now)).collect()
}

/// One all-or-nothing check at time `now`, with the one Rust definition of the bucket
/// (`ratelimit_protocol::Shape`) applied as the script applies its own.
pub fn check(state: &mut Buckets, rules: &[RuleSpec], now: u128) -> Vec<RuleOutcome> {
    let shape = |r: &RuleSpec| Shape::of(r.burst, r.num, r.den, r.cost);
    let levels: Vec<i128> = rules
        .iter()
        .map(|r| {
            let stored = state.get(&r.key).map(|b| Level {
                units: b.units,
                at_ms: b.at,
            });
            shape(r).level_at(stored, now)
        })
        .collect();
    let admitted = rules.iter().zip(&levels).all(|(r, &l)| shape(r).admits(l));
    rules
        .iter()
        .zip(levels)
        .map(|(r, level)| {
            let (left, outcome) = shape(r).apply(level, admitted);
            if admitted {
                state.insert(
                    r.key.clone(),
                    Bucket {
                        units: left,
                        at: now,
                    },
                );
            }
            outcome
        })
        .collect()
}
