//! The token bucket script on a real Valkey, one check at a time: exact counts, refill,
//! cost, all-or-nothing, expiry, concurrency, reload, and agreement with the native model
//! over random batches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::buckets::{age, batch, redis_now_ms, rule, run, store, stored};
use common::model::{self, Buckets};
use common::{Connect, Valkey};
use ratelimit_bridge::check::{Check, RuleOutcome, RuleSpec};
use ratelimit_bridge::store::Store;
use ratelimit_protocol::gcd;
use std::time::Duration;

#[tokio::test]
async fn a_burst_admits_exactly_capacity_then_denies() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 10 tokens, one more per hour.
    let r = [rule("b", 10, 1, 3_600_000, 1)];
    for expected_left in (0..10).rev() {
        let (_, out) = run(&store, &r).await;
        assert!(out[0].allowed);
        assert_eq!(out[0].remaining, expected_left);
    }
    let (_, out) = run(&store, &r).await;
    assert!(!out[0].allowed);
    assert_eq!(out[0].remaining, 0);
    assert!(
        out[0].wait_ms > 3_500_000 && out[0].wait_ms <= 3_600_000,
        "{:?}",
        out[0]
    );
    assert!(
        out[0].full_ms > 35_000_000 && out[0].full_ms <= 36_000_000,
        "{:?}",
        out[0]
    );
}

#[tokio::test]
async fn tokens_come_back_with_time() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 3 tokens, one more every 10 s.
    let r = [rule("t", 3, 1, 10_000, 1)];
    for _ in 0..3 {
        assert!(run(&store, &r).await.1[0].allowed);
    }
    assert!(!run(&store, &r).await.1[0].allowed);
    age(&valkey, "t", 25_000); // 2.5 tokens' worth
    let (_, out) = run(&store, &r).await;
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 1);
    assert!(run(&store, &r).await.1[0].allowed);
    assert!(!run(&store, &r).await.1[0].allowed);
}

#[tokio::test]
async fn refill_in_real_time_within_a_generous_window() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // One token, ten per second: back after 100 ms; we wait 400.
    let r = [rule("rt", 1, 1, 100, 1)];
    assert!(run(&store, &r).await.1[0].allowed);
    assert!(!run(&store, &r).await.1[0].allowed);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(run(&store, &r).await.1[0].allowed);
}

#[tokio::test]
async fn cost_takes_several_tokens_and_says_how_long_to_wait() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 10 tokens, one per second, 3 per request: 3 requests, then 1 token left.
    let r = [rule("c", 10, 1, 1000, 3)];
    for left in [7, 4, 1] {
        let (_, out) = run(&store, &r).await;
        assert!(out[0].allowed);
        assert_eq!(out[0].remaining, left);
    }
    let (_, out) = run(&store, &r).await;
    assert!(!out[0].allowed);
    assert_eq!(out[0].remaining, 1);
    assert!(
        out[0].wait_ms > 1_900 && out[0].wait_ms <= 2_000,
        "{:?}",
        out[0]
    );
}

#[tokio::test]
async fn a_denied_request_takes_no_token_from_any_rule() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let roomy = rule("roomy", 100, 1, 3_600_000, 1);
    let tight = rule("tight", 1, 1, 3_600_000, 1);
    assert!(run(&store, &[roomy.clone(), tight.clone()])
        .await
        .1
        .iter()
        .all(|o| o.allowed));
    let before = stored(&valkey, "roomy");
    for _ in 0..5 {
        let (_, out) = run(&store, &[roomy.clone(), tight.clone()]).await;
        assert!(out[0].allowed, "roomy alone would admit");
        assert!(!out[1].allowed);
        assert_eq!(out[0].remaining, 99, "roomy was not charged");
    }
    assert_eq!(stored(&valkey, "roomy"), before);
    assert_eq!(run(&store, &[roomy]).await.1[0].remaining, 98);
}

#[tokio::test]
async fn buckets_expire_a_second_after_they_are_full() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = [rule("e", 5, 1, 1000, 2)];
    let (_, out) = run(&store, &r).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("e")
        .query(&mut valkey.connection())
        .unwrap();
    assert!(pttl > 0, "an expiry is set");
    // Never before the bucket is full (a missing key reads as full), at most a second after.
    assert!(
        pttl as u64 > out[0].full_ms && pttl as u64 <= out[0].full_ms + 1_000,
        "pttl {pttl}, {:?}",
        out[0]
    );
    // Once expired the bucket is full again.
    let r = [rule("short", 2, 1, 10, 1)];
    run(&store, &r).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg("short")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn parallel_checks_never_admit_more_than_capacity() {
    let valkey = Valkey::start();
    // Several connections, many checks in flight at once on one bucket.
    let stores: Vec<Store> = (0..4).map(|_| store(&valkey)).collect();
    let r = vec![rule("hot", 50, 1, 3_600_000, 1)];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..400 {
        let (s, r) = (stores[i % 4].clone(), r.clone());
        tasks.spawn(async move { s.check(&r).await.unwrap().1[0].allowed });
    }
    let admitted = tasks.join_all().await.into_iter().filter(|&a| a).count();
    assert_eq!(admitted, 50);
}

#[tokio::test]
async fn the_script_is_reloaded_after_a_script_flush() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = [rule("f", 5, 1, 1000, 1)];
    run(&store, &r).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(run(&store, &r).await.1[0].remaining, 3);
}

/// xorshift64*: deterministic pseudo-random runs without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A random limit: `burst` tokens, a rate of so many per second, minute, hour or day.
fn random_rule(rng: &mut Rng, key: String) -> RuleSpec {
    let burst = 1 + rng.below(20);
    let per_ms = [1_000, 60_000, 3_600_000, 86_400_000][rng.below(4) as usize];
    let requests = 1 + rng.below(500);
    let g = gcd(requests, per_ms);
    rule(&key, burst, requests / g, per_ms / g, 1 + rng.below(burst))
}

#[tokio::test]
async fn the_script_agrees_with_the_model_over_random_runs() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut admitted, mut denied) = (0, 0);
    for run_no in 0..40 {
        // A few buckets, each with its own limit, shared by the checks of a run.
        let limits: Vec<RuleSpec> = (0..1 + rng.below(4))
            .map(|i| random_rule(&mut rng, format!("m{run_no}:{i}")))
            .collect();
        let mut state = Buckets::new();
        for _ in 0..30 {
            if rng.below(3) == 0 {
                let ms = u128::from(rng.below(120_000));
                for r in &limits {
                    if let Some(b) = state.get_mut(&r.key) {
                        age(&valkey, &r.key, ms);
                        b.at -= ms;
                    }
                }
            }
            // A batch of 1..=8 checks, each on a random subset of the buckets (a key at
            // most once per check, as the wire format demands), in a random order.
            let checks: Vec<Check> = (0..1 + rng.below(8))
                .map(|_| {
                    let mut rules: Vec<RuleSpec> = limits
                        .iter()
                        .filter(|_| rng.below(2) == 0)
                        .cloned()
                        .collect();
                    if rules.is_empty() {
                        rules.push(limits[rng.below(limits.len() as u64) as usize].clone());
                    }
                    let turn = rng.below(rules.len() as u64) as usize;
                    rules.rotate_left(turn);
                    rules
                })
                .collect();
            let got = batch(&store, &checks).await;
            let now = got[0].0;
            assert!(
                got.iter().all(|(t, _)| *t == now),
                "one Redis time per call"
            );
            let got: Vec<Vec<RuleOutcome>> = got.into_iter().map(|(_, o)| o).collect();
            let expected = model::batch(&mut state, &checks, u128::from(now));
            assert_eq!(got, expected, "run {run_no}: {checks:?}");
            for check in &got {
                if check.iter().all(|o| o.allowed) {
                    admitted += 1;
                } else {
                    denied += 1;
                }
            }
            let redis_now = u128::from(redis_now_ms(&valkey));
            for r in &limits {
                match (stored(&valkey, &r.key), state.get(&r.key)) {
                    (Some(bucket), Some(m)) => assert_eq!(bucket, *m, "stored state of {}", r.key),
                    (None, None) => {}
                    // Gone already: only legitimate if the bucket is full by now.
                    (None, Some(m)) => {
                        let cap = u128::from(r.burst) * u128::from(r.den);
                        let full_ms = (cap - m.units).div_ceil(u128::from(r.num));
                        assert!(redis_now >= m.at + full_ms, "{} expired early", r.key);
                    }
                    (Some(bucket), None) => panic!("{} stored {bucket:?} unasked", r.key),
                }
            }
        }
    }
    assert!(
        admitted > 500 && denied > 500,
        "{admitted} admitted, {denied} denied"
    );
}

#[tokio::test]
async fn a_changed_limit_reads_the_same_tokens_in_its_own_units() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 10 an hour (den 360,000): 4 taken, 6 left.
    let hourly = rule("rl:r:k", 10, 1, 360_000, 1);
    for _ in 0..4 {
        assert!(run(&store, std::slice::from_ref(&hourly)).await.1[0].allowed);
    }
    // Raised to 100 an hour (den 36,000): still 6 tokens, not a full bucket of 100.
    let raised = rule("rl:r:k", 100, 1, 36_000, 1);
    let (_, out) = run(&store, std::slice::from_ref(&raised)).await;
    assert_eq!(out[0].remaining, 5, "{out:?}");
    // Lowered to 3 a minute (den 20,000): at most 3 tokens, however many there were.
    let lowered = rule("rl:r:k", 3, 1, 20_000, 1);
    let (_, out) = run(&store, std::slice::from_ref(&lowered)).await;
    assert_eq!(out[0].remaining, 2, "{out:?}");
    // A value written before units were stored (tag 1) reads in the reader's units.
    let mut legacy = vec![1u8];
    legacy.extend((4.0 * 3_600_000.0f64).to_le_bytes());
    legacy.extend((redis_now_ms(&valkey) as f64).to_le_bytes());
    let _: () = redis::cmd("SET")
        .arg("rl:r:old")
        .arg(legacy)
        .query(&mut Connect::connection(&valkey))
        .unwrap();
    let (_, out) = run(&store, &[rule("rl:r:old", 10, 1, 3_600_000, 1)]).await;
    assert_eq!(out[0].remaining, 3, "{out:?}");
}
