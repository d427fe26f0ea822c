//! `failure_mode: "local"`: while the backend is unreachable each gateway enforces the rules
//! itself, with token buckets in the host's shared data (shared by the worker threads of one
//! gateway) sized to `local_share` of the global limit. Neither fail-open's flood nor
//! fail-closed's outage.
//!
//! Exact like Redis's buckets (the same integer arithmetic, `ratelimit_protocol::Shape`,
//! with the share as a fraction of a million), but memory is bounded by hashing client keys
//! into `buckets` buckets per rule (clients that collide share a bucket, which only makes
//! the degraded mode stricter). A check is all-or-nothing: it takes from each of its
//! buckets in turn, each take conditional (compare-and-swap) on the bucket still holding
//! the cost, and gives back what it took if a later bucket turns out short.
//!
//! Fairness: one bucket refills at `r` = `share` x requests/per. A client rotating values
//! to spread its requests over every bucket of a rule, at `a` requests per unit of time,
//! can keep at most `a / r` of the `buckets` buckets empty, so at most that share of the
//! other clients are refused; more buckets make it harder. The first use of a bucket by
//! two workers at the same instant may lose one take (shared data has no create-if-absent),
//! admitting one extra request once.
//!
//! A metered rule admitted here is settled here too (`settle`): what its response cost
//! beyond its reservation is taken from the same bucket, below 0 if need be, as Redis would.

use crate::host::SharedData;
use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;
use ratelimit_config::digest;
use ratelimit_config::limit::Limit;
use ratelimit_config::options::LocalOptions;
use ratelimit_protocol::{signed, Level, Shape};

/// Compare-and-swap attempts before giving up on a contended bucket.
const CAS_ATTEMPTS: usize = 8;
/// The local share is applied as the fraction `round(share x SHARE_SCALE) / SHARE_SCALE`,
/// so the local buckets stay in exact integers like Redis's.
const SHARE_SCALE: u64 = 1_000_000;

/// A bucket as stored in shared data: its level in units (16 bytes, signed: a bucket may
/// owe) at `at_ms` (8 bytes).
fn decode(bytes: &[u8]) -> Option<Level> {
    let units = i128::from_le_bytes(bytes.get(..16)?.try_into().ok()?);
    let at_ms = u64::from_le_bytes(bytes.get(16..24)?.try_into().ok()?);
    Some(Level {
        units,
        at_ms: u128::from(at_ms),
    })
}

fn encode(units: i128, now_ms: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[..16].copy_from_slice(&units.to_le_bytes());
    out[16..].copy_from_slice(&now_ms.to_le_bytes());
    out
}

/// One rule's local bucket, as a check of `cost` tokens sees it.
#[derive(Debug, Clone, Copy)]
pub struct Bucket<'a> {
    pub rule_name: &'a str,
    /// The rule's bucket key in Redis, hashed into one of the local buckets.
    pub key: &'a str,
    pub limit: &'a Limit,
    pub cost: u64,
}

/// The local share (`p / SHARE_SCALE`) of one rule's bucket, in units of 1/(den x
/// SHARE_SCALE) tokens: `p / SHARE_SCALE` of its capacity and of its refill, but never
/// less than one request's cost, or a small share would lock everyone out.
fn scaled(limit: &Limit, cost: u64, share: f64) -> Shape {
    let p = u128::from(((share * SHARE_SCALE as f64).round() as u64).clamp(1, SHARE_SCALE));
    let den = u128::from(limit.den) * u128::from(SHARE_SCALE);
    let cost = u128::from(cost) * den;
    Shape {
        capacity: (u128::from(limit.burst) * u128::from(limit.den) * p).max(cost),
        num: u128::from(limit.num) * p,
        den,
        cost,
    }
}

fn slot_key(rule_name: &str, bucket_key: &str, buckets: u64) -> String {
    let slot = digest::bucket_of(bucket_key.as_bytes(), buckets.max(1));
    format!("ratelimit.local.{rule_name}.{slot}")
}

/// A bucket's level now and its version; an absent or unreadable entry is a full bucket.
fn level(store: &impl SharedData, key: &str, s: &Shape, now_ms: u64) -> (i128, u32) {
    let (stored, cas) = store
        .get(key)
        .map_or((None, 0), |(bytes, cas)| (decode(&bytes), cas));
    (s.level_at(stored, u128::from(now_ms)), cas)
}

/// Checks `planned` against this gateway's local buckets, charging them only if every rule
/// admits; answers in the bridge's terms so the same decision and headers follow.
/// `rule_names[i]` names `planned[i]`'s rule. `None` when the buckets stayed contended.
pub fn admit(
    store: &impl SharedData,
    planned: &[PlannedRule],
    rule_names: &[&str],
    options: LocalOptions,
    now_ms: u64,
) -> Option<Vec<RuleResult>> {
    let keys: Vec<String> = planned
        .iter()
        .zip(rule_names)
        .map(|(p, name)| slot_key(name, &p.key, options.buckets))
        .collect();
    let shapes: Vec<Shape> = (planned.iter())
        .map(|p| scaled(&p.limit, p.cost, options.share))
        .collect();
    let mut levels: Vec<i128> = keys
        .iter()
        .zip(&shapes)
        .map(|(k, s)| level(store, k, s, now_ms).0)
        .collect();
    let mut admitted = levels.iter().zip(&shapes).all(|(l, s)| s.admits(*l));
    if admitted {
        admitted = take_all(store, &keys, &shapes, &mut levels, now_ms)?;
    }
    let results = shapes
        .iter()
        .zip(levels)
        .map(|(s, level)| s.apply(level, admitted).1)
        .collect();
    Some(results)
}

/// Settles a metered rule this gateway admitted: takes `delta` tokens more from `bucket`
/// (below 0: gives them back, up to its capacity), past 0 down to `debt` tokens owed
/// (never raising a bucket already below that). The tokens it lent: taken beyond what the
/// bucket held. A bucket that stayed contended is not settled (logged).
pub fn settle(
    store: &impl SharedData,
    bucket: &Bucket<'_>,
    delta: i64,
    debt: u64,
    options: LocalOptions,
    now_ms: u64,
) -> u64 {
    let s = scaled(bucket.limit, bucket.cost, options.share);
    let key = slot_key(bucket.rule_name, bucket.key, options.buckets);
    let den = signed(s.den);
    let change = i128::from(delta).saturating_mul(den);
    let lowest = signed(u128::from(debt).saturating_mul(s.den)).saturating_neg();
    let settled = |before: i128| {
        let after = before.saturating_sub(change).min(signed(s.capacity));
        match change > 0 {
            true => after.max(lowest).min(before),
            false => after,
        }
    };
    let Some(Ok(before)) = update(store, &key, &s, now_ms, |before| Some(settled(before))) else {
        log::debug!("local bucket {key} contended: a settlement of {delta} is lost");
        return 0;
    };
    let owed = |level: i128| level.min(0).saturating_neg();
    let lent = owed(settled(before)) - owed(before);
    u64::try_from(lent.max(0) / den.max(1)).unwrap_or(u64::MAX)
}

/// Takes each bucket's cost in turn; `levels` get the level each take found. If a bucket
/// is short by now (another worker took since the first look), what was taken goes back
/// and the check is denied (`false`). `None`: a bucket stayed contended (what was taken
/// went back).
fn take_all(
    store: &impl SharedData,
    keys: &[String],
    shapes: &[Shape],
    levels: &mut [i128],
    now_ms: u64,
) -> Option<bool> {
    for (i, (key, s)) in keys.iter().zip(shapes).enumerate() {
        let outcome = update(store, key, s, now_ms, |level| {
            s.admits(level).then(|| s.apply(level, true).0)
        });
        let taken = match outcome {
            Some(Ok(found)) => {
                if let Some(level) = levels.get_mut(i) {
                    *level = found;
                }
                continue;
            }
            Some(Err(short)) => {
                if let Some(level) = levels.get_mut(i) {
                    *level = short;
                }
                Some(false)
            }
            None => None,
        };
        for (key, s) in keys.iter().zip(shapes).take(i) {
            let restored = update(store, key, s, now_ms, |level| {
                Some(level.saturating_add(signed(s.cost)).min(signed(s.capacity)))
            });
            if restored.is_none() {
                log::debug!("local bucket {key} contended: a taken token is lost");
            }
        }
        return taken;
    }
    Some(true)
}

/// Applies `change` to a bucket's level (compare-and-swap loop): `Ok(level found)` once
/// the changed level is stored, `Err(level found)` if `change` refused it, `None` if the
/// bucket stayed contended.
fn update(
    store: &impl SharedData,
    key: &str,
    s: &Shape,
    now_ms: u64,
    change: impl Fn(i128) -> Option<i128>,
) -> Option<Result<i128, i128>> {
    for _ in 0..CAS_ATTEMPTS {
        let (found, cas) = level(store, key, s, now_ms);
        let Some(changed) = change(found) else {
            return Some(Err(found));
        };
        if store.set(key, &encode(changed, now_ms), cas) {
            return Some(Ok(found));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{planned, FakeShared};
    use ratelimit_config::options::DEFAULT_BUCKETS;

    fn share(share: f64) -> LocalOptions {
        LocalOptions {
            share,
            buckets: DEFAULT_BUCKETS,
        }
    }

    #[test]
    fn admits_the_local_share_of_the_burst() {
        let store = FakeShared::default();
        let p = [planned("rl:u:a", 100, 100, 60_000, 1)];
        let admitted = (0..100)
            .filter(|_| admit(&store, &p, &["u"], share(0.25), 0).unwrap()[0].allowed)
            .count();
        assert_eq!(admitted, 25);
    }

    #[test]
    fn refills_at_the_local_share_of_the_rate() {
        let store = FakeShared::default();
        // 60 per minute, share 0.5: 30 now, then one every 2 s.
        let p = [planned("k", 60, 60, 60_000, 1)];
        while admit(&store, &p, &["r"], share(0.5), 0).unwrap()[0].allowed {}
        let denied = admit(&store, &p, &["r"], share(0.5), 0).unwrap();
        assert_eq!(denied[0].wait_ms, 2_000);
        assert!(!admit(&store, &p, &["r"], share(0.5), 1_999).unwrap()[0].allowed);
        assert!(admit(&store, &p, &["r"], share(0.5), 2_000).unwrap()[0].allowed);
    }

    #[test]
    fn a_denied_request_charges_no_rule() {
        let store = FakeShared::default();
        let roomy = planned("a", 100, 100, 60_000, 1);
        let tight = planned("b", 4, 4, 60_000, 1);
        let both = [roomy.clone(), tight];
        for _ in 0..2 {
            assert!(admit(&store, &both, &["r1", "r2"], share(0.5), 0)
                .unwrap()
                .iter()
                .all(|r| r.allowed));
        }
        let out = admit(&store, &both, &["r1", "r2"], share(0.5), 0).unwrap();
        assert!(!out[1].allowed && out[0].allowed);
        assert_eq!(
            admit(&store, &[roomy], &["r1"], share(0.5), 0).unwrap()[0].remaining,
            47
        );
    }

    /// Another worker drains bucket `victim` right after this worker's first look at it,
    /// before its take: the race a shared-data store without transactions allows.
    struct Racing<'a> {
        store: &'a FakeShared,
        victim: String,
        looks: std::cell::Cell<u32>,
    }

    impl SharedData for Racing<'_> {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            if key == self.victim {
                self.looks.set(self.looks.get() + 1);
                if self.looks.get() == 2 {
                    self.store.set(key, &encode(0, 0), 0);
                }
            }
            self.store.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
            self.store.set(key, value, cas)
        }
    }

    #[test]
    fn a_bucket_drained_between_look_and_take_denies_and_takes_nothing_elsewhere() {
        let store = FakeShared::default();
        let (a, b) = (
            planned("a", 100, 100, 60_000, 1),
            planned("b", 100, 100, 60_000, 1),
        );
        let racing = Racing {
            store: &store,
            victim: slot_key("r2", "b", DEFAULT_BUCKETS),
            looks: std::cell::Cell::new(0),
        };
        let out = admit(&racing, &[a.clone(), b], &["r1", "r2"], share(1.0), 0).unwrap();
        assert!(!out[1].allowed, "b was empty when taken: {out:?}");
        assert!(!out.iter().all(|r| r.allowed));
        // a's token went back.
        assert_eq!(
            admit(&store, &[a], &["r1"], share(1.0), 0).unwrap()[0].remaining,
            99
        );
    }

    #[test]
    fn tiny_shares_still_admit_one_request() {
        let store = FakeShared::default();
        let p = [planned("k", 2, 2, 60_000, 1)];
        assert!(admit(&store, &p, &["r"], share(0.01), 0).unwrap()[0].allowed);
        assert!(!admit(&store, &p, &["r"], share(0.01), 0).unwrap()[0].allowed);
    }

    #[test]
    fn garbage_in_shared_data_reads_as_a_full_bucket() {
        let store = FakeShared::default();
        let p = [planned("k", 10, 10, 60_000, 1)];
        store.set(&slot_key("r", "k", DEFAULT_BUCKETS), b"junk", 0);
        assert_eq!(
            admit(&store, &p, &["r"], share(1.0), 0).unwrap()[0].remaining,
            9
        );
    }

    #[test]
    fn keys_map_to_a_bounded_set_of_slots() {
        let distinct: std::collections::HashSet<String> = (0..10_000)
            .map(|i| slot_key("r", &format!("rl:r:user{i}"), DEFAULT_BUCKETS))
            .collect();
        assert_eq!(distinct.len() as u64, DEFAULT_BUCKETS);
        let few: std::collections::HashSet<String> = (0..1000)
            .map(|i| slot_key("r", &format!("rl:r:user{i}"), 4))
            .collect();
        assert_eq!(few.len(), 4);
    }
}
