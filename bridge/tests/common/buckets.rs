//! Driving the store and looking at what the script stored, for the tests that hold the
//! script to its behaviour (`script.rs`, `batch.rs`).

use super::model::Bucket;
use super::{Connect, Valkey};
use ratelimit_bridge::check::{Check, RuleOutcome, RuleSpec};
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;

pub fn store(valkey: &Valkey) -> Store {
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    };
    Store::new(&valkey.url(), options).unwrap()
}

pub fn rule(key: &str, burst: u64, num: u64, den: u64, cost: u64) -> RuleSpec {
    RuleSpec {
        key: key.into(),
        burst,
        num,
        den,
        cost,
        block: None,
    }
}

pub async fn run(store: &Store, rules: &[RuleSpec]) -> (u64, Vec<RuleOutcome>) {
    store.check(&rules.to_vec()).await.unwrap()
}

pub async fn batch(store: &Store, checks: &[Check]) -> Vec<(u64, Vec<RuleOutcome>)> {
    let out = store.check_all(checks).await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// Reads a bucket's stored state: tag 1, then its level in units and the Redis time (ms)
/// of that level, as little-endian doubles.
pub fn stored(server: &impl Connect, key: &str) -> Option<Bucket> {
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap();
    let value = value?;
    assert!(value.len() == 17 && value[0] == 1, "stored {value:?}");
    let double = |at: usize| f64::from_le_bytes(value[at..at + 8].try_into().unwrap());
    let (units, at) = (double(1), double(9));
    for v in [units, at] {
        assert!(
            v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53),
            "stored {v}"
        );
    }
    Some(Bucket {
        units: units as u128,
        at: at as u128,
    })
}

/// A bucket as the script stores it.
pub fn encode(b: Bucket) -> Vec<u8> {
    let mut value = vec![1];
    value.extend((b.units as f64).to_le_bytes());
    value.extend((b.at as f64).to_le_bytes());
    value
}

/// Moves a bucket's last update `ms` into the past: the same as waiting `ms`. An expired
/// bucket is full already, and waiting leaves it full.
pub fn age(valkey: &Valkey, key: &str, ms: u128) {
    let Some(b) = stored(valkey, key) else { return };
    let value = encode(Bucket { at: b.at - ms, ..b });
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
