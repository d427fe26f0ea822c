//! `failure_mode: "local"`: while the backend is unreachable each gateway enforces the rules
//! itself, with token buckets in the host's shared data (shared by the worker threads of one
//! gateway) sized to `local_share` of the global limit. Neither fail-open's flood nor
//! fail-closed's outage.
//!
//! Approximate by design: buckets are float, and memory is bounded by hashing client keys
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

use crate::config::LocalOptions;
use crate::digest;
use crate::host::SharedData;
use crate::protocol::RuleResult;
use crate::rules::PlannedRule;

/// Compare-and-swap attempts before giving up on a contended bucket.
const CAS_ATTEMPTS: usize = 8;

/// A bucket's stored state: tokens at `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

impl Bucket {
    fn decode(bytes: &[u8]) -> Option<Bucket> {
        let tokens = f64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let at_ms = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        tokens.is_finite().then_some(Bucket { tokens, at_ms })
    }

    fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.tokens.to_le_bytes());
        out[8..].copy_from_slice(&self.at_ms.to_le_bytes());
        out
    }
}

/// The local share of one rule's limit.
struct Scaled {
    capacity: f64,
    per_ms: f64,
    cost: f64,
}

fn scaled(rule: &PlannedRule, share: f64) -> Scaled {
    let l = &rule.limit;
    Scaled {
        // Never below one request's cost, or a small share would lock everyone out.
        capacity: (l.burst as f64 * share).max(rule.cost as f64),
        per_ms: l.requests as f64 * share / l.per_ms as f64,
        cost: rule.cost as f64,
    }
}

fn slot_key(rule_name: &str, bucket_key: &str, buckets: u64) -> String {
    let slot = digest::bucket_of(bucket_key.as_bytes(), buckets.max(1));
    format!("ratelimit.local.{rule_name}.{slot}")
}

fn level(store: &impl SharedData, key: &str, s: &Scaled, now_ms: u64) -> (f64, u32) {
    match store.get(key) {
        Some((bytes, cas)) => {
            let tokens = Bucket::decode(&bytes).map_or(s.capacity, |b| {
                let elapsed = now_ms.saturating_sub(b.at_ms) as f64;
                (b.tokens + elapsed * s.per_ms).min(s.capacity)
            });
            (tokens, cas)
        }
        None => (s.capacity, 0),
    }
}

/// Checks `planned` against this gateway's local buckets, charging them only if every rule
/// admits; answers in the bridge's terms so the same decision and headers follow.
/// `rule_names[i]` names `planned[i]`'s rule. `None` when the buckets stayed contended.
pub fn check(
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
    let scales: Vec<Scaled> = planned.iter().map(|p| scaled(p, options.share)).collect();
    let mut levels: Vec<f64> = keys
        .iter()
        .zip(&scales)
        .map(|(k, s)| level(store, k, s, now_ms).0)
        .collect();
    let mut admitted = levels.iter().zip(&scales).all(|(l, s)| *l >= s.cost);
    if admitted {
        admitted = take_all(store, &keys, &scales, &mut levels, now_ms)?;
    }
    let results = scales
        .iter()
        .zip(levels)
        .map(|(s, tokens)| {
            let wait = if admitted {
                0.0
            } else {
                (s.cost - tokens).max(0.0) / s.per_ms
            };
            RuleResult {
                allowed: wait == 0.0,
                remaining: tokens.max(0.0) as u64,
                full_ms: ((s.capacity - tokens).max(0.0) / s.per_ms).ceil() as u64,
                wait_ms: wait.ceil() as u64,
            }
        })
        .collect();
    Some(results)
}

/// Takes each bucket's cost in turn; `levels` get what is left. If a bucket is short by
/// now (another worker took since the first look), what was taken goes back and the check
/// is denied (`false`). `None`: a bucket stayed contended (what was taken went back).
fn take_all(
    store: &impl SharedData,
    keys: &[String],
    scales: &[Scaled],
    levels: &mut [f64],
    now_ms: u64,
) -> Option<bool> {
    for (i, (key, s)) in keys.iter().zip(scales).enumerate() {
        let outcome = update(store, key, s, now_ms, |tokens| {
            (tokens >= s.cost).then_some(tokens - s.cost)
        });
        let taken = match outcome {
            Some(Ok(left)) => {
                if let Some(level) = levels.get_mut(i) {
                    *level = left;
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
        for (key, s) in keys.iter().zip(scales).take(i) {
            let refunded = update(store, key, s, now_ms, |tokens| {
                Some((tokens + s.cost).min(s.capacity))
            });
            if refunded.is_none() {
                log::debug!("local bucket {key} contended: a taken token is lost");
            }
        }
        return taken;
    }
    Some(true)
}

/// Applies `change` to a bucket's level (compare-and-swap loop): `Ok(new level)` once
/// stored, `Err(level)` if `change` refused it, `None` if the bucket stayed contended.
fn update(
    store: &impl SharedData,
    key: &str,
    s: &Scaled,
    now_ms: u64,
    change: impl Fn(f64) -> Option<f64>,
) -> Option<Result<f64, f64>> {
    for _ in 0..CAS_ATTEMPTS {
        let (tokens, cas) = level(store, key, s, now_ms);
        let Some(left) = change(tokens) else {
            return Some(Err(tokens));
        };
        let bucket = Bucket {
            tokens: left,
            at_ms: now_ms,
        };
        if store.set(key, &bucket.encode(), cas) {
            return Some(Ok(left));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_BUCKETS;
    use crate::fakes::FakeShared;
    use crate::limit::Limit;

    fn share(share: f64) -> LocalOptions {
        LocalOptions {
            share,
            buckets: DEFAULT_BUCKETS,
        }
    }

    fn planned(key: &str, requests: u64, per_ms: u64, cost: u64) -> PlannedRule {
        PlannedRule {
            rule: 0,
            key: key.into(),
            limit: Limit {
                requests,
                per_ms,
                burst: requests,
                num: requests,
                den: per_ms,
            },
            cost,
        }
    }

    #[test]
    fn admits_the_local_share_of_the_burst() {
        let store = FakeShared::default();
        let p = [planned("rl:u:a", 100, 60_000, 1)];
        let admitted = (0..100)
            .filter(|_| check(&store, &p, &["u"], share(0.25), 0).unwrap()[0].allowed)
            .count();
        assert_eq!(admitted, 25);
    }

    #[test]
    fn refills_at_the_local_share_of_the_rate() {
        let store = FakeShared::default();
        // 60 per minute, share 0.5: 30 now, then one every 2 s.
        let p = [planned("k", 60, 60_000, 1)];
        while check(&store, &p, &["r"], share(0.5), 0).unwrap()[0].allowed {}
        let denied = check(&store, &p, &["r"], share(0.5), 0).unwrap();
        assert_eq!(denied[0].wait_ms, 2_000);
        assert!(!check(&store, &p, &["r"], share(0.5), 1_999).unwrap()[0].allowed);
        assert!(check(&store, &p, &["r"], share(0.5), 2_000).unwrap()[0].allowed);
    }

    #[test]
    fn a_denied_request_charges_no_rule() {
        let store = FakeShared::default();
        let roomy = planned("a", 100, 60_000, 1);
        let tight = planned("b", 4, 60_000, 1);
        let both = [roomy.clone(), tight];
        for _ in 0..2 {
            assert!(check(&store, &both, &["r1", "r2"], share(0.5), 0)
                .unwrap()
                .iter()
                .all(|r| r.allowed));
        }
        let out = check(&store, &both, &["r1", "r2"], share(0.5), 0).unwrap();
        assert!(!out[1].allowed && out[0].allowed);
        assert_eq!(
            check(&store, &[roomy], &["r1"], share(0.5), 0).unwrap()[0].remaining,
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
                    let empty = Bucket {
                        tokens: 0.0,
                        at_ms: 0,
                    };
                    self.store.set(key, &empty.encode(), 0);
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
        let (a, b) = (planned("a", 100, 60_000, 1), planned("b", 100, 60_000, 1));
        let racing = Racing {
            store: &store,
            victim: slot_key("r2", "b", DEFAULT_BUCKETS),
            looks: std::cell::Cell::new(0),
        };
        let out = check(&racing, &[a.clone(), b], &["r1", "r2"], share(1.0), 0).unwrap();
        assert!(!out[1].allowed, "b was empty when taken: {out:?}");
        assert!(!out.iter().all(|r| r.allowed));
        // a's token went back.
        assert_eq!(
            check(&store, &[a], &["r1"], share(1.0), 0).unwrap()[0].remaining,
            99
        );
    }

    #[test]
    fn tiny_shares_still_admit_one_request() {
        let store = FakeShared::default();
        let p = [planned("k", 2, 60_000, 1)];
        assert!(check(&store, &p, &["r"], share(0.01), 0).unwrap()[0].allowed);
        assert!(!check(&store, &p, &["r"], share(0.01), 0).unwrap()[0].allowed);
    }

    #[test]
    fn garbage_in_shared_data_reads_as_a_full_bucket() {
        let store = FakeShared::default();
        let p = [planned("k", 10, 60_000, 1)];
        store.set(&slot_key("r", "k", DEFAULT_BUCKETS), b"junk", 0);
        assert_eq!(
            check(&store, &p, &["r"], share(1.0), 0).unwrap()[0].remaining,
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
