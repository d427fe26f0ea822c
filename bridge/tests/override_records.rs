//! The overrides in Redis: no key of theirs has a TTL (`maxmemory-policy volatile-ttl`, which
//! the buckets need, evicts only keys that have one), yet an override ends on time: readers
//! hold each record's expiry to Redis's clock, and the next write deletes expired records.

use crate::common::buckets::store;
use crate::common::{Connect, Valkey};
use ratelimit_bridge::engine::overrides::registry;
use ratelimit_bridge::engine::overrides::{parse_spec, Target};
use ratelimit_bridge::store::Store;
use std::time::Duration;

const INDEX: &str = "rl:{overrides}";

fn pttl(valkey: &Valkey, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut valkey.connection())
        .unwrap()
}

async fn set(store: &Store, value: &str, ttl: &str) {
    let target = Target::new("rl", "per-user", &[value.into()]).unwrap();
    let (limit, ttl_ms) = parse_spec(5, "1m", None, ttl).unwrap();
    registry::set(store, target, limit, ttl_ms).await.unwrap();
}

async fn listed(store: &Store) -> Vec<String> {
    let active = registry::list(store, "rl").await.unwrap();
    active.into_iter().map(|o| o.target.key).collect()
}

#[tokio::test]
async fn overrides_have_no_ttl_and_still_end_on_time() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    set(&store, "alice", "400ms").await;
    // -1: the key exists and has no TTL.
    assert_eq!(pttl(&valkey, INDEX), -1, "the index has a TTL");
    assert_eq!(pttl(&valkey, "rl:{overrides}:per-user:alice"), -1);
    assert_eq!(listed(&store).await, ["rl:per-user:alice"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        listed(&store).await,
        Vec::<String>::new(),
        "past its expiry"
    );
    // The next write deletes the expired record and its index entry.
    set(&store, "bob", "1h").await;
    assert_eq!(
        pttl(&valkey, "rl:{overrides}:per-user:alice"),
        -2,
        "the expired record stayed"
    );
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(INDEX)
        .arg(0)
        .arg(-1)
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(members, ["per-user:bob"]);
    assert_eq!(listed(&store).await, ["rl:per-user:bob"]);
}

#[tokio::test]
async fn an_index_that_an_older_bridge_gave_a_ttl_loses_it() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    set(&store, "alice", "1h").await;
    let _: () = redis::cmd("PEXPIRE")
        .arg(INDEX)
        .arg(60_000)
        .query(&mut valkey.connection())
        .unwrap();
    set(&store, "bob", "1h").await;
    assert_eq!(pttl(&valkey, INDEX), -1);
    assert_eq!(listed(&store).await.len(), 2);
}
