//! The token bucket in plain Rust, exact (u128), written from the specification in
//! `lua/token_bucket.lua`, so that the script can be checked against it.

use ratelimit_bridge::wire::{RuleOutcome, RuleSpec};

/// A bucket's stored state: its level in units at Redis time `at` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub units: u128,
    pub at: u128,
}

/// One all-or-nothing check at time `now`; `state[i]` is rule i's bucket (`None`: full).
pub fn check(state: &mut [Option<Bucket>], rules: &[RuleSpec], now: u128) -> Vec<RuleOutcome> {
    let levels: Vec<u128> = rules
        .iter()
        .zip(state.iter())
        .map(|(r, s)| {
            let cap = u128::from(r.burst) * u128::from(r.den);
            s.map_or(cap, |b| {
                cap.min(b.units + now.saturating_sub(b.at) * u128::from(r.num))
            })
        })
        .collect();
    let need = |r: &RuleSpec| u128::from(r.cost) * u128::from(r.den);
    let admitted = rules.iter().zip(&levels).all(|(r, &l)| l >= need(r));
    rules
        .iter()
        .zip(levels)
        .zip(state.iter_mut())
        .map(|((r, mut level), slot)| {
            let (num, den) = (u128::from(r.num), u128::from(r.den));
            let cap = u128::from(r.burst) * den;
            let mut wait = 0;
            if admitted {
                level -= need(r);
                *slot = Some(Bucket {
                    units: level,
                    at: now,
                });
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
