//! Driving the store and looking at what the script stored, for the tests that hold the
//! script to its behaviour (`script.rs`, `batch.rs`).

use super::model::Bucket;
use super::{Connect, Valkey};
use ratelimit_bridge::store::check::{Check, RuleOutcome, RuleSpec};
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;

/// The store's timeouts in these tests: two seconds to connect, five for an answer.
pub fn options() -> StoreOptions {
    StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    }
}

pub fn store(valkey: &Valkey) -> Store {
    Store::new(&valkey.url(), options()).unwrap()
}

pub fn rule(key: &str, burst: u64, num: u64, den: u64, cost: u64) -> RuleSpec {
    RuleSpec::plain(key, burst, num, den, cost)
}

/// A rule on `key` with a bucket of `burst`, a token an hour: what a test spends stays spent.
pub fn hourly(key: &str, burst: u64) -> RuleSpec {
    RuleSpec::plain(key, burst, 1, 3_600_000, 1)
}

pub async fn run(store: &Store, rules: &[RuleSpec]) -> (u64, Vec<RuleOutcome>) {
    store.check(&rules.to_vec()).await.unwrap()
}

pub async fn batch(store: &Store, checks: &[Check]) -> Vec<(u64, Vec<RuleOutcome>)> {
    let out = store.check_all(checks).await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// A bucket's raw value, if its key exists.
fn raw(server: &impl Connect, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

/// Reads a bucket's stored state: tag 3, then its level in units, the Redis time (ms) of
/// that level and the units' `den`, as little-endian doubles (tag 2, a rule that blocks,
/// and tag 4, a bucket under an override, start the same way).
pub fn stored(server: &impl Connect, key: &str) -> Option<Bucket> {
    let value = raw(server, key)?;
    assert!(
        matches!((value.len(), value[0]), (25, 3) | (49, 2) | (81, 4)),
        "stored {value:?}"
    );
    let double = |at: usize| f64::from_le_bytes(value[at..at + 8].try_into().unwrap());
    let (units, at, den) = (double(1), double(9), double(17));
    for v in [units, at, den] {
        assert!(
            v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53),
            "stored {v}"
        );
    }
    assert!(den >= 1.0, "stored den {den}");
    Some(Bucket {
        units: units as i128,
        at: at as u128,
    })
}

/// Moves a bucket's last update `ms` into the past: the same as waiting `ms`. An expired
/// bucket is full already, and waiting leaves it full.
pub fn age(valkey: &Valkey, key: &str, ms: u128) {
    let Some(mut value) = raw(valkey, key) else {
        return;
    };
    let b = stored(valkey, key).unwrap();
    value[9..17].copy_from_slice(&((b.at - ms) as f64).to_le_bytes());
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("KEEPTTL")
        .query(&mut valkey.connection())
        .unwrap();
}

/// Script calls (`EVALSHA`) the server ran since the last `CONFIG RESETSTAT`.
pub fn script_calls(server: &impl Connect) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

pub fn reset_stats(server: &impl Connect) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
}

pub fn redis_now_ms(valkey: &Valkey) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut valkey.connection()).unwrap();
    s * 1000 + us / 1000
}
