//! The token bucket script on a real Valkey: exact counts, refill, cost, all-or-nothing,
//! expiry, concurrency, and agreement with the native model over random runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::model::{self, Bucket};
use common::{Connect, Valkey};
use ratelimit_bridge::store::{Store, StoreOptions};
use ratelimit_bridge::wire::{RuleOutcome, RuleSpec};
use std::time::Duration;

fn store(valkey: &Valkey) -> Store {
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    };
    Store::new(&valkey.url(), options).unwrap()
}

fn rule(key: &str, burst: u64, num: u64, den: u64, cost: u64) -> RuleSpec {
    RuleSpec {
        key: key.into(),
        burst,
        num,
        den,
        cost,
    }
}

async fn run(store: &Store, rules: &[RuleSpec]) -> (u64, Vec<RuleOutcome>) {
    store.check(&rules.to_vec()).await.unwrap()
}

/// Reads a bucket's stored "<units> <ms>".
fn stored(valkey: &Valkey, key: &str) -> Option<Bucket> {
    let value: Option<String> = redis::cmd("GET")
        .arg(key)
        .query(&mut valkey.connection())
        .unwrap();
    let value = value?;
    let (units, at) = value.split_once(' ').unwrap();
    Some(Bucket {
        units: units.parse().unwrap(),
        at: at.parse().unwrap(),
    })
}

/// Moves a bucket's last update `ms` into the past: the same as waiting `ms`. An expired
/// bucket is full already, and waiting leaves it full.
fn age(valkey: &Valkey, key: &str, ms: u128) {
    let Some(b) = stored(valkey, key) else { return };
    let value = format!("{} {}", b.units, b.at - ms);
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("KEEPTTL")
        .query(&mut valkey.connection())
        .unwrap();
}

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
async fn buckets_expire_no_later_than_when_full() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = [rule("e", 5, 1, 1000, 2)];
    let (_, out) = run(&store, &r).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("e")
        .query(&mut valkey.connection())
        .unwrap();
    assert!(pttl > 0, "an expiry is set");
    assert!(
        pttl as u64 <= out[0].full_ms && out[0].full_ms == 2_000,
        "pttl {pttl}, {:?}",
        out[0]
    );
    // Once expired the bucket is full again.
    let r = [rule("short", 2, 1, 10, 1)];
    run(&store, &r).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
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

#[tokio::test]
async fn the_script_agrees_with_the_model_over_random_runs() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for run_no in 0..40 {
        let rules: Vec<RuleSpec> = (0..1 + rng.below(3))
            .map(|i| {
                let burst = 1 + rng.below(20);
                let per_ms = [1_000, 60_000, 3_600_000, 86_400_000][rng.below(4) as usize];
                let requests = 1 + rng.below(500);
                let g = gcd(requests, per_ms);
                rule(
                    &format!("m{run_no}:{i}"),
                    burst,
                    requests / g,
                    per_ms / g,
                    1 + rng.below(burst),
                )
            })
            .collect();
        let mut state: Vec<Option<Bucket>> = vec![None; rules.len()];
        for _ in 0..30 {
            if rng.below(3) == 0 {
                let ms = u128::from(rng.below(120_000));
                for (r, s) in rules.iter().zip(state.iter_mut()) {
                    if let Some(b) = s {
                        age(&valkey, &r.key, ms);
                        b.at -= ms;
                    }
                }
            }
            let (now, got) = run(&store, &rules).await;
            let expected = model::check(&mut state, &rules, u128::from(now));
            assert_eq!(got, expected, "run {run_no}: {rules:?}");
            for ((r, s), o) in rules.iter().zip(&state).zip(&got) {
                if !got.iter().all(|o| o.allowed) {
                    continue;
                }
                match stored(&valkey, &r.key) {
                    Some(bucket) => assert_eq!(Some(bucket), *s, "stored state of {}", r.key),
                    // Gone already: only legitimate if it was due to expire by now.
                    None => assert!(
                        redis_now_ms(&valkey) >= now + o.full_ms,
                        "{} expired early",
                        r.key
                    ),
                }
            }
        }
    }
}

fn redis_now_ms(valkey: &Valkey) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut valkey.connection()).unwrap();
    s * 1000 + us / 1000
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
