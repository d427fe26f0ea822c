//! The token bucket in plain Rust, exact (u128), written from the specification in
//! `lua/token_bucket.lua`, so that the script can be checked against it.

use ratelimit_bridge::check::{RuleOutcome, RuleSpec};
use std::collections::HashMap;

/// A bucket's stored state: its level in units at Redis time `at` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub units: u128,
    pub at: u128,
}

/// Every bucket by key; a missing key is a full bucket.
pub type Buckets = HashMap<String, Bucket>;

/// A batch at time `now`: its checks one after the other, as the script applies them.
pub fn batch(state: &mut Buckets, checks: &[Vec<RuleSpec>], now: u128) -> Vec<Vec<RuleOutcome>> {
    checks.iter().map(|c| check(state, c, now)).collect()
}

/// One all-or-nothing check at time `now`.
pub fn check(state: &mut Buckets, rules: &[RuleSpec], now: u128) -> Vec<RuleOutcome> {
    let levels: Vec<u128> = rules
        .iter()
        .map(|r| {
            let cap = u128::from(r.burst) * u128::from(r.den);
            state.get(&r.key).map_or(cap, |b| {
                cap.min(b.units + now.saturating_sub(b.at) * u128::from(r.num))
            })
        })
        .collect();
    let need = |r: &RuleSpec| u128::from(r.cost) * u128::from(r.den);
    let admitted = rules.iter().zip(&levels).all(|(r, &l)| l >= need(r));
    rules
        .iter()
        .zip(levels)
        .map(|(r, mut level)| {
            let (num, den) = (u128::from(r.num), u128::from(r.den));
            let cap = u128::from(r.burst) * den;
            let mut wait = 0;
            if admitted {
                level -= need(r);
                state.insert(
                    r.key.clone(),
                    Bucket {
                        units: level,
                        at: now,
                    },
                );
            } else if level < need(r) {
                wait = (need(r) - level).div_ceil(num);
            }
            RuleOutcome {
                allowed: wait == 0,
                remaining: (level / den) as u64,
                full_ms: ((cap - level).div_ceil(num)) as u64,
                wait_ms: wait as u64,
            }
        })
        .collect()
}
