//! The deny cache: what a worker learned from the bridge about buckets that cannot admit
//! a request before some time, so that a client far over its limit stops costing a
//! callout, a bridge round trip and a script call per request.
//!
//! Exact: when the script answers that a bucket lacks a request's cost for `wait_ms`, no
//! request of that cost or more can be admitted by that bucket before then, whatever the
//! other gateways do (they only take tokens). The entry's deadline counts from when the
//! check was *sent*, which is before Redis's clock read it, so the cache never denies past
//! the moment Redis would admit. (A refund, which only a Cluster race or a returned lease
//! makes, can put tokens back earlier: the cache then denies a little longer than Redis
//! would, never less.)
//!
//! Blocks (`block` in a rule) are not exact in that sense: an operator may lift one at any
//! time (`ratelimit-bridge unblock`, or deleting the bucket), and a gateway that kept
//! refusing the client until the block's end (up to 30 days) would make that useless. So
//! a cached block decides for at most `BLOCK_TRUST_MS` after its check was asked, then the
//! bridge is asked again (a blocked client costs a worker one check a second at most); its
//! `Retry-After` still counts down to the block's end. So is a denial reached under a size
//! an operator may change (a client's plan, an override, which the bridge's reply names),
//! and an exhausted calendar quota, which nothing refills before its period ends.
//!
//! Bounded: at most `cap` entries per worker (`deny_cache_entries`, whose default and
//! ceiling are the configuration's: `ratelimit_config::options`). When it is full, expired
//! entries go first, then the eighth that expires soonest, so inserting stays cheap under
//! a flood of keys.

use hashbrown::HashMap;
use ratelimit_config::limit::Limit;

/// How long a worker trusts a block it learned from the bridge: a lifted block reaches
/// every gateway within about this long.
pub const BLOCK_TRUST_MS: u64 = 1_000;

/// Why a bucket cannot admit before `until_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// It lacks `cost` tokens: requests of that cost or more are denied.
    Empty { cost: u64 },
    /// Its client is blocked: every request is refused.
    Blocked,
}

/// One cached verdict, in the worker's own clock (ms since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub reason: Reason,
    /// Until when this entry decides requests without the bridge.
    pub until_ms: u64,
    /// When the verdict ends as the bridge said (the cost available again, the block
    /// over), for `Retry-After`: `until_ms` for a denial, later for a block.
    pub ends_ms: u64,
    /// When the bucket will be full again, for `X-RateLimit-Reset`.
    pub full_ms: u64,
    /// The limit the verdict was reached under: a client whose tier changed asks again.
    pub limit: Limit,
    /// The bucket's size the bridge said was in force (a plan's), to show; 0: `limit`'s.
    pub in_force: u64,
}

impl Entry {
    /// The verdict of a check asked at `asked_ms` that the bridge answered with `wait_ms`
    /// (the rest of the block, for `Reason::Blocked`) and `full_ms`.
    pub fn new(reason: Reason, asked_ms: u64, wait_ms: u64, full_ms: u64, limit: Limit) -> Entry {
        let ends_ms = asked_ms.saturating_add(wait_ms);
        let until_ms = match reason {
            Reason::Empty { .. } if limit.calendar.is_none() => ends_ms,
            // A calendar quota is empty until its period ends, weeks maybe: an operator who
            // raises it (an override) must reach the client as soon as a lifted block does.
            Reason::Empty { .. } | Reason::Blocked => {
                ends_ms.min(asked_ms.saturating_add(BLOCK_TRUST_MS))
            }
        };
        Entry {
            reason,
            until_ms,
            ends_ms,
            full_ms: asked_ms.saturating_add(full_ms),
            limit,
            in_force: 0,
        }
    }

    /// This verdict reached under a size the bridge said was in force (`in_force`: a
    /// client's plan, an override; 0: none), which an operator may change at any time: then
    /// trusted for a second at most, as a block is, so that a client whose plan is raised
    /// is not refused past it.
    pub fn in_force(self, in_force: u64, asked_ms: u64) -> Entry {
        if in_force == 0 {
            return self;
        }
        Entry {
            in_force,
            until_ms: self.until_ms.min(asked_ms.saturating_add(BLOCK_TRUST_MS)),
            ..self
        }
    }

    /// Whether this entry decides a request of `cost` under `limit` at `now_ms`.
    fn decides(&self, limit: &Limit, cost: u64, now_ms: u64) -> bool {
        self.limit == *limit
            && match self.reason {
                Reason::Empty { cost: lacking } => now_ms < self.until_for(cost, lacking),
                Reason::Blocked => now_ms < self.until_ms,
            }
    }

    /// Until when the bucket that lacked `lacking` tokens (until `until_ms`) lacks `cost`:
    /// as long, or for a cheaper request the refill of the difference less (and a ms
    /// more, since the wait it was told was rounded up), so never past the moment Redis
    /// would admit it.
    fn until_for(&self, cost: u64, lacking: u64) -> u64 {
        let Some(cheaper) = lacking.checked_sub(cost).filter(|&d| d > 0) else {
            return self.until_ms;
        };
        if self.limit.calendar.is_some() {
            // Nothing refills before the period ends, yet what is left may hold it.
            return 0;
        }
        let refill = u128::from(cheaper) * u128::from(self.limit.den);
        let ms = refill.div_ceil(u128::from(self.limit.num.max(1))) + 1;
        self.until_ms
            .saturating_sub(u64::try_from(ms).unwrap_or(u64::MAX))
    }
}

/// One worker's deny cache.
#[derive(Debug, Default)]
pub struct DenyCache {
    cap: usize,
    entries: HashMap<String, Entry>,
}

impl DenyCache {
    /// A cache of at most `cap` entries (0: never caches).
    pub fn new(cap: u64) -> DenyCache {
        DenyCache {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            entries: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry that decides a request of `cost` for `key` under `limit`, if one does.
    pub fn lookup(&self, key: &str, limit: &Limit, cost: u64, now_ms: u64) -> Option<Entry> {
        if self.entries.is_empty() {
            return None;
        }
        self.entries
            .get(key)
            .filter(|e| e.decides(limit, cost, now_ms))
            .copied()
    }

    /// Remembers `entry` for `key`, replacing what was known of it.
    pub fn insert(&mut self, key: &str, entry: Entry, now_ms: u64) {
        if self.cap == 0 || entry.until_ms <= now_ms {
            return;
        }
        if let Some(known) = self.entries.get_mut(key) {
            *known = entry;
            return;
        }
        if self.entries.len() >= self.cap {
            self.make_room(now_ms);
        }
        self.entries.insert(key.to_owned(), entry);
    }

    /// Drops the expired entries and, if that is not enough, the eighth (at least one)
    /// that expires soonest: a full scan pays for many inserts.
    fn make_room(&mut self, now_ms: u64) {
        self.entries.retain(|_, e| e.until_ms > now_ms);
        let keep = self.cap - (self.cap / 8).max(1);
        if self.entries.len() <= keep {
            return;
        }
        let mut deadlines: Vec<u64> = self.entries.values().map(|e| e.until_ms).collect();
        let cut = deadlines.len() - keep;
        let (_, &mut threshold, _) = deadlines.select_nth_unstable(cut - 1);
        let mut dropped = 0;
        self.entries.retain(|_, e| {
            let drop = e.until_ms <= threshold && dropped < cut;
            dropped += usize::from(drop);
            !drop
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `burst` requests a minute, the rate reduced as `Limit::new` reduces it.
    fn per_minute(burst: u64) -> Limit {
        Limit {
            requests: burst,
            per_ms: 60_000,
            burst,
            num: 1,
            den: 60_000 / burst,
            calendar: None,
        }
    }

    fn empty(cost: u64, until_ms: u64) -> Entry {
        Entry::new(
            Reason::Empty { cost },
            0,
            until_ms,
            until_ms + 1000,
            per_minute(10),
        )
    }

    #[test]
    fn a_calendar_quotas_denial_is_trusted_a_second_and_never_for_a_cheaper_request() {
        let monthly = Limit::calendar(100, ratelimit_protocol::calendar::Period::Month, 1);
        let Ok(monthly) = monthly else {
            unreachable!("a valid quota")
        };
        let mut cache = DenyCache::new(10);
        // Empty for the 20 days left of its month.
        let entry = Entry::new(Reason::Empty { cost: 5 }, 0, 20 * 86_400_000, 0, monthly);
        assert_eq!(
            entry.ends_ms,
            20 * 86_400_000,
            "Retry-After: the period's end"
        );
        cache.insert("rl:q:a", entry, 0);
        assert!(cache
            .lookup("rl:q:a", &monthly, 5, BLOCK_TRUST_MS - 1)
            .is_some());
        assert!(cache
            .lookup("rl:q:a", &monthly, 5, BLOCK_TRUST_MS)
            .is_none());
        assert!(cache.lookup("rl:q:a", &monthly, 4, 0).is_none());
    }

    #[test]
    fn a_denial_under_a_plan_is_trusted_a_second_and_shows_its_size() {
        let entry = empty(2, 60_000).in_force(25, 0);
        assert_eq!(
            (entry.until_ms, entry.ends_ms, entry.in_force),
            (BLOCK_TRUST_MS, 60_000, 25)
        );
        assert_eq!(empty(2, 60_000).in_force(0, 0), empty(2, 60_000));
    }

    #[test]
    fn a_denial_decides_requests_of_its_cost_or_more_until_its_deadline() {
        let mut cache = DenyCache::new(10);
        cache.insert("rl:r:a", empty(2, 1_500), 1_000);
        let l = per_minute(10);
        assert!(cache.lookup("rl:r:a", &l, 2, 1_000).is_some());
        assert!(cache.lookup("rl:r:a", &l, 5, 1_499).is_some());
        assert!(
            cache.lookup("rl:r:a", &l, 1, 1_000).is_none(),
            "a cheaper request may pass: a token is 6 s of refill"
        );
        assert!(
            cache.lookup("rl:r:a", &l, 2, 1_500).is_none(),
            "over at the deadline"
        );
        assert!(
            cache.lookup("rl:r:b", &l, 2, 1_000).is_none(),
            "another key"
        );
        assert!(
            cache.lookup("rl:r:a", &per_minute(20), 2, 1_000).is_none(),
            "another limit"
        );
    }

    #[test]
    fn a_block_decides_every_request_for_a_second_at_most() {
        let mut cache = DenyCache::new(10);
        let block = Entry::new(Reason::Blocked, 1_000, 8_000, 8_000, per_minute(10));
        assert_eq!((block.until_ms, block.ends_ms), (2_000, 9_000));
        cache.insert("rl:r:a", block, 1_000);
        assert_eq!(
            cache.lookup("rl:r:a", &per_minute(10), 1, 1_999),
            Some(block)
        );
        assert!(cache.lookup("rl:r:a", &per_minute(10), 1, 2_000).is_none());
        let ending = Entry::new(Reason::Blocked, 1_000, 300, 300, per_minute(10));
        assert_eq!(
            ending.until_ms, 1_300,
            "a block ending sooner decides until then"
        );
    }

    #[test]
    fn nothing_is_cached_without_room_or_past_its_deadline() {
        let mut off = DenyCache::new(0);
        off.insert("k", empty(1, 2_000), 1_000);
        assert!(off.is_empty());
        let mut cache = DenyCache::new(4);
        cache.insert("k", empty(1, 1_000), 1_000);
        assert!(cache.is_empty());
    }

    #[test]
    fn a_full_cache_stays_within_its_cap_dropping_what_expires_soonest() {
        let cap = 1_000;
        let mut cache = DenyCache::new(cap);
        for i in 0..100_000u64 {
            // Deadlines rise with i, except every 10th key, which lives long.
            let until = if i % 10 == 0 {
                1_000_000 + i
            } else {
                10_000 + i
            };
            cache.insert(&format!("rl:r:{i}"), empty(1, until), 5_000);
            assert!(cache.len() <= cap as usize, "{} entries", cache.len());
        }
        let l = per_minute(10);
        assert!(
            cache.lookup("rl:r:99999", &l, 1, 5_000).is_some(),
            "the newest stays"
        );
        assert!(
            cache.lookup("rl:r:99990", &l, 1, 5_000).is_some(),
            "the longest stays"
        );
        assert!(
            cache.lookup("rl:r:1", &l, 1, 5_000).is_none(),
            "the soonest went"
        );
        // Once time passes, expired entries make room before live ones are dropped.
        cache.insert("late", empty(1, 3_000_000), 2_000_000);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_cheaper_request_is_decided_while_the_bucket_lacks_even_its_cost() {
        // 10 a minute (a token every 6 s); a request of 5 told to wait 60 s. A token is
        // 24 s of refill less, so 1 token lacks until 36 s, less the ms of rounding.
        let mut cache = DenyCache::new(10);
        let l = per_minute(10);
        let entry = Entry::new(Reason::Empty { cost: 5 }, 0, 60_000, 90_000, l);
        cache.insert("rl:r:a", entry, 0);
        assert!(cache.lookup("rl:r:a", &l, 1, 35_998).is_some());
        assert!(cache.lookup("rl:r:a", &l, 1, 35_999).is_none());
        assert!(cache.lookup("rl:r:a", &l, 4, 53_998).is_some());
        assert!(cache.lookup("rl:r:a", &l, 4, 53_999).is_none());
        assert!(cache.lookup("rl:r:a", &l, 5, 59_999).is_some());
        // The bucket's arithmetic agrees: the level that waits 60 s for 5 tokens (5 owed)
        // holds 1 token at 36 s, not before.
        let owing = Some(ratelimit_protocol::Level {
            units: -5 * i128::from(l.den),
            at_ms: 0,
        });
        let shape = |cost| ratelimit_protocol::Shape::of(10, l.num, l.den, cost);
        assert_eq!(
            shape(5).apply(shape(5).level_at(owing, 0), false).1.wait_ms,
            60_000
        );
        let one = shape(1);
        assert!(
            !one.admits(one.level_at(owing, 35_999)) && one.admits(one.level_at(owing, 36_000))
        );
    }
}
