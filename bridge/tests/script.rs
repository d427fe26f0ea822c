//! The token bucket script on a real Valkey, one check at a time: exact counts, refill,
//! cost, all-or-nothing, expiry, concurrency, reload, and agreement with the native model
//! over random batches.

use crate::common::buckets::{age, batch, redis_now_ms, rule, run, store, stored};
use crate::common::model::{self, Buckets};
use crate::common::{Connect, Valkey};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use ratelimit_bridge::store::check::{Check, RuleOutcome, RuleSpec};
use ratelimit_bridge::store::Store;
use ratelimit_protocol::gcd;
use std::cell::Cell;
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

/// One limit of a run: a burst, so many requests per one of `PERIODS`, and a cost (taken
/// modulo the burst).
type Limit = (u64, u64, usize, u64);
/// One step of a run: time passing (maybe), then a batch of checks, each the run's buckets
/// picked by a bit mask, in a rotation.
type Step = (Option<u64>, Vec<(u8, u8)>);

const PERIODS: [u64; 4] = [1_000, 60_000, 3_600_000, 86_400_000];

/// Runs of a few buckets with their own limits, and 30 steps each.
fn runs() -> impl Strategy<Value = (Vec<Limit>, Vec<Step>)> {
    let limit = (1..=20u64, 1..=500u64, 0..PERIODS.len(), any::<u64>());
    let batch = prop::collection::vec((any::<u8>(), any::<u8>()), 1..=8);
    let step = (prop::option::weighted(1.0 / 3.0, 0..120_000u64), batch);
    (
        prop::collection::vec(limit, 1..=4),
        prop::collection::vec(step, 30),
    )
}

fn limit_rule(key: String, (burst, requests, period, cost): Limit) -> RuleSpec {
    let per_ms = PERIODS[period];
    let g = gcd(requests, per_ms);
    rule(&key, burst, requests / g, per_ms / g, 1 + cost % burst)
}

/// The checks of a batch: each on the buckets its mask picks (a key at most once per
/// check, as the wire format demands; one bucket if the mask picks none), rotated.
fn checks_of(limits: &[RuleSpec], batch: &[(u8, u8)]) -> Vec<Check> {
    batch
        .iter()
        .map(|&(mask, turn)| {
            let mut rules: Vec<RuleSpec> = (0..limits.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| limits[i].clone())
                .collect();
            if rules.is_empty() {
                rules.push(limits[usize::from(mask) % limits.len()].clone());
            }
            let len = rules.len();
            rules.rotate_left(usize::from(turn) % len);
            rules
        })
        .collect()
}

/// One run against the script and the model, on keys of its own; the checks admitted and
/// denied.
async fn agree(
    valkey: &Valkey,
    store: &Store,
    run_no: u64,
    limits: &[Limit],
    steps: &[Step],
) -> (u64, u64) {
    let limits: Vec<RuleSpec> = limits
        .iter()
        .enumerate()
        .map(|(i, &l)| limit_rule(format!("m{run_no}:{i}"), l))
        .collect();
    let (mut state, mut admitted, mut denied) = (Buckets::new(), 0, 0);
    for (passing, batch_of) in steps {
        if let Some(ms) = passing.map(u128::from) {
            for r in &limits {
                if let Some(b) = state.get_mut(&r.key) {
                    age(valkey, &r.key, ms);
                    b.at -= ms;
                }
            }
        }
        let checks = checks_of(&limits, batch_of);
        let got = batch(store, &checks).await;
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
        let redis_now = u128::from(redis_now_ms(valkey));
        for r in &limits {
            match (stored(valkey, &r.key), state.get(&r.key)) {
                (Some(bucket), Some(m)) => assert_eq!(bucket, *m, "stored state of {}", r.key),
                (None, None) => {}
                // Gone already: only legitimate if the bucket is full by now.
                (None, Some(m)) => {
                    let cap = i128::from(r.burst) * i128::from(r.den);
                    let short = u128::try_from(cap - m.units).unwrap();
                    let full_ms = short.div_ceil(u128::from(r.num));
                    assert!(redis_now >= m.at + full_ms, "{} expired early", r.key);
                }
                (Some(bucket), None) => panic!("{} stored {bucket:?} unasked", r.key),
            }
        }
    }
    (admitted, denied)
}

/// Random runs (proptest, a fixed seed: the same runs every time, and a failing one shrunk
/// to a small case), each step's answers and stored buckets held to the native model.
#[test]
fn the_script_agrees_with_the_model_over_random_runs() {
    let valkey = Valkey::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(async { store(&valkey) });
    let config = Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let (run_no, admitted, denied) = (Cell::new(0), Cell::new(0), Cell::new(0));
    runner
        .run(&runs(), |(limits, steps)| {
            run_no.set(run_no.get() + 1);
            let (a, d) = runtime.block_on(agree(&valkey, &store, run_no.get(), &limits, &steps));
            admitted.set(admitted.get() + a);
            denied.set(denied.get() + d);
            Ok(())
        })
        .unwrap();
    let (admitted, denied) = (admitted.get(), denied.get());
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
