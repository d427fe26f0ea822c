//! The token bucket a rule's numbers describe (`burst`, `num`, `den`, `cost`), in exact
//! integers: its one definition in Rust. Redis runs the same arithmetic in
//! `lua/token_bucket.lua` (the bridge's tests hold the script to this), and the filter's
//! local failure mode runs this directly.
//!
//! A token is `den` units and the bucket refills `num` units per millisecond, so
//! `num / den` tokens per ms is the rate, reduced. The shape is `u128`: products of
//! numbers below 2^64 cannot overflow. A level is `i128`: a metered rule's settlement may
//! take a bucket below 0 (a debt), and the arithmetic saturates rather than wrap.

use crate::reply::RuleResult;

/// Greatest common divisor, to reduce a rate to `num / den`.
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A bucket's size, refill and price, in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub capacity: u128,
    /// Units refilled per millisecond (> 0).
    pub num: u128,
    /// Units per token (> 0).
    pub den: u128,
    /// Units one check takes.
    pub cost: u128,
}

impl Shape {
    /// The bucket of a rule as the wire format sends it: `burst` tokens, `num / den` tokens
    /// per ms, `cost` tokens per check.
    pub fn of(burst: u64, num: u64, den: u64, cost: u64) -> Shape {
        let den = u128::from(den.max(1));
        Shape {
            capacity: u128::from(burst) * den,
            num: u128::from(num.max(1)),
            den,
            cost: u128::from(cost) * den,
        }
    }
}

/// A bucket as stored: `units` at time `at_ms` (below 0: owed). No stored state is a full
/// bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub units: i128,
    pub at_ms: u128,
}

/// `n` as a level, saturating.
pub fn signed(n: u128) -> i128 {
    i128::try_from(n).unwrap_or(i128::MAX)
}

impl Shape {
    /// The level at `now_ms`: refilled since it was stored, never above capacity, never
    /// refilled by a clock that went back.
    pub fn level_at(&self, stored: Option<Level>, now_ms: u128) -> i128 {
        let capacity = signed(self.capacity);
        stored.map_or(capacity, |l| {
            let refill = signed(now_ms.saturating_sub(l.at_ms).saturating_mul(self.num));
            capacity.min(l.units.saturating_add(refill))
        })
    }

    /// Whether `level` holds one check's cost.
    pub fn admits(&self, level: i128) -> bool {
        level >= signed(self.cost)
    }

    /// Applies a check's outcome at `level`: `taken` says whether the check (all its rules)
    /// was admitted and takes its cost here. The level left, and the rule's answer (whole
    /// tokens left, none while it owes; ms until full; ms until the cost is there: 0 when
    /// it was taken).
    pub fn apply(&self, level: i128, taken: bool) -> (i128, RuleResult) {
        let left = if taken {
            level.saturating_sub(signed(self.cost))
        } else {
            level
        };
        // Distances from `left` up to a level, in units: at least 0.
        let up_to = |to: u128| u128::try_from(signed(to).saturating_sub(left)).unwrap_or(0);
        let wait = if taken {
            0
        } else {
            up_to(self.cost).div_ceil(self.num)
        };
        let result = RuleResult {
            allowed: wait == 0,
            blocked: false,
            remaining: saturate(u128::try_from(left).unwrap_or(0) / self.den),
            full_ms: saturate(up_to(self.capacity).div_ceil(self.num)),
            wait_ms: saturate(wait),
            leased: 0,
            owed: 0,
            borrowed: 0,
            limit: 0,
        };
        (left, result)
    }
}

fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_reduce_exactly() {
        assert_eq!(gcd(100, 60_000), 100);
        assert_eq!(gcd(7, 13), 1);
        assert_eq!(gcd(0, 5), 5);
    }

    #[test]
    fn a_bucket_fills_takes_and_says_how_long_to_wait() {
        // 10 tokens, 1 per second (1 unit per ms, 1000 units per token), cost 3.
        let s = Shape::of(10, 1, 1000, 3);
        let full = s.level_at(None, 5);
        assert_eq!(full, 10_000);
        let (left, r) = s.apply(full, true);
        assert_eq!(
            (left, r.remaining, r.full_ms, r.wait_ms),
            (7_000, 7, 3_000, 0)
        );
        let (left, r) = s.apply(2_500, false);
        assert_eq!(
            (left, r.allowed, r.remaining, r.wait_ms),
            (2_500, false, 2, 500)
        );
        // Refill caps at capacity; a clock that went back refills nothing.
        let stored = Some(Level {
            units: 9_000,
            at_ms: 100,
        });
        assert_eq!(s.level_at(stored, 100 + 5_000), 10_000);
        assert_eq!(s.level_at(stored, 50), 9_000);
        assert!(s.admits(3_000) && !s.admits(2_999));
    }

    #[test]
    fn a_bucket_in_debt_refills_towards_the_cost_and_shows_nothing_left() {
        let s = Shape::of(10, 1, 1000, 3);
        let owing = Some(Level {
            units: -4_000,
            at_ms: 0,
        });
        assert_eq!(s.level_at(owing, 1_000), -3_000);
        assert!(!s.admits(-3_000));
        let (left, r) = s.apply(-3_000, false);
        // 6 tokens to the cost, 13 to the brim, at a token a second; none left.
        assert_eq!(
            (left, r.allowed, r.remaining, r.wait_ms, r.full_ms),
            (-3_000, false, 0, 6_000, 13_000)
        );
        assert_eq!(s.level_at(owing, 7_000), 3_000);
        assert!(s.admits(3_000));
    }
}
