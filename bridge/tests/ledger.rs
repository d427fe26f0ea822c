//! The ledger of a global rule (`lua/ledger.lua`) on a real Valkey, as the bridges call it:
//! what it holds plus what it has out on leases never passes its capacity, however grants,
//! returns, refills and expiries interleave; a grant or a return sent again is the same one;
//! a ledger written by another server, or missing on a server younger than a lease's life,
//! or missing on a server that may have lost it (a promoted replica, a flush, an eviction),
//! grants nothing until every lease the old one could have granted is over (learning), and
//! refills only from then.

use crate::common::buckets::store;
use crate::common::{Connect, Valkey};
use ratelimit_bridge::engine::regions::ledger::{call, ledger_key, Mode, Reply, Shape};
use ratelimit_bridge::store::Store;
use std::time::Duration;

/// 100 tokens, 1 a second (1 unit a ms, 1,000 units a token).
const SHAPE: Shape = Shape {
    capacity: 100,
    num: 1,
    den: 1_000,
};
const TTL: u64 = 400;

/// One call of `mode` on the test's key, which must answer.
async fn ledger(store: &Store, mode: Mode, holder: &str, seq: u64, tokens: u64) -> Reply {
    ledger_for(store, mode, holder, seq, tokens, TTL).await
}

/// `ledger` with leases of `ttl` ms.
async fn ledger_for(
    store: &Store,
    mode: Mode,
    holder: &str,
    seq: u64,
    tokens: u64,
    ttl: u64,
) -> Reply {
    (call(store, "rl:g:k", mode, holder, seq, tokens, ttl, SHAPE).await).unwrap()
}

async fn grant(store: &Store, holder: &str, seq: u64, tokens: u64) -> Reply {
    ledger(store, Mode::Grant, holder, seq, tokens).await
}

async fn give_back(store: &Store, holder: &str, seq: u64, tokens: u64) -> Reply {
    ledger(store, Mode::Return, holder, seq, tokens).await
}

async fn read(store: &Store) -> Reply {
    ledger(store, Mode::Read, "", 0, 0).await
}

/// A Valkey past the learning a fresh server starts in (uptime above a lease's life).
async fn settled_valkey() -> (Valkey, Store) {
    let valkey = Valkey::start();
    let store = store(&valkey);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(read(&store).await.learning_until_ms, 0);
    (valkey, store)
}

#[tokio::test]
async fn what_the_ledger_holds_and_has_out_never_passes_its_capacity() {
    let (_valkey, store) = settled_valkey().await;
    let a = grant(&store, "a/1", 1, 60).await;
    assert_eq!((a.tokens, a.level, a.outstanding), (60, 40, 60));
    // More than it holds: what it holds.
    let b = grant(&store, "b/1", 1, 70).await;
    assert_eq!((b.tokens, b.level, b.outstanding), (40, 0, 100));
    // While both leases are out, the refill adds nothing: 100 are out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = read(&store).await;
    assert_eq!((r.level, r.outstanding), (0, 100));
    // A return gives back what its holder did not spend: what it spent stays spent.
    let back = give_back(&store, "a/1", 1, 25).await;
    assert_eq!((back.tokens, back.level, back.outstanding), (25, 25, 40));
    // Once b's lease is over at the ledger, the refill goes on from there.
    tokio::time::sleep(Duration::from_millis(TTL + 50)).await;
    let r = read(&store).await;
    assert_eq!(r.outstanding, 0);
    assert!(
        (25..=26).contains(&r.level),
        "{r:?}: a token a second since the return"
    );
    assert!(r.level + r.outstanding <= SHAPE.capacity);
}

#[tokio::test]
async fn a_grant_or_a_return_sent_again_is_the_same_one() {
    let (_valkey, store) = settled_valkey().await;
    let first = grant(&store, "a/1", 7, 30).await;
    let again = grant(&store, "a/1", 7, 30).await;
    assert_eq!(
        (again.tokens, again.expires_ms),
        (first.tokens, first.expires_ms)
    );
    assert_eq!((again.level, again.outstanding), (70, 30), "taken once");
    assert_eq!(give_back(&store, "a/1", 7, 30).await.tokens, 30);
    let twice = give_back(&store, "a/1", 7, 30).await;
    assert_eq!((twice.tokens, twice.level), (0, 100), "given back once");
    // A holder's seq is its own: another holder's seq 7 is another lease.
    assert_eq!(grant(&store, "b/1", 7, 10).await.tokens, 10);
}

#[tokio::test]
async fn a_ledger_written_by_another_server_grants_nothing_until_its_leases_are_over() {
    let (valkey, store) = settled_valkey().await;
    assert_eq!(grant(&store, "a/1", 1, 50).await.tokens, 50);
    // As a replica promoted after missing writes would find it: written by another server.
    let key = ledger_key("rl:g:k");
    let mut conn = valkey.connection();
    let value: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let forged = format!("{}{}", "f".repeat(40), &value[40..]);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(forged)
        .query(&mut conn)
        .unwrap();
    // Asked for leases of 2 s: it learns for the longest lease it knows of.
    let learning = ledger_for(&store, Mode::Grant, "b/1", 1, 10, 2_000).await;
    assert_eq!(learning.tokens, 0);
    assert!(learning.learning_until_ms > learning.now_ms, "{learning:?}");
    assert!(learning.wait_ms >= 2_000 - 50, "{learning:?}");
    // And drained: the grants it may have missed took from the level. After learning, it
    // has what the refill brought since learning's end (a token a second), not the 50 it
    // "held", nor what the refill brought while the old leases could still be spent.
    tokio::time::sleep(Duration::from_millis(learning.wait_ms + 1_100)).await;
    let after = grant(&store, "b/1", 2, 10).await;
    refilled_since_learning(&after, &learning);
}

/// `after` was granted what the refill brought since `learning` ended, and no more.
fn refilled_since_learning(after: &Reply, learning: &Reply) {
    assert_eq!(after.learning_until_ms, 0, "{after:?}");
    let refilled = (after.now_ms - learning.learning_until_ms) / 1_000;
    assert!(refilled >= 1, "{after:?}");
    assert_eq!(after.tokens, refilled, "{after:?} after {learning:?}");
}

/// Grants `key` nothing, learning for about `TTL`, and then only what the refill brings.
async fn learns(store: &Store, key: &str) {
    let call = |seq, tokens| call(store, key, Mode::Grant, "b/1", seq, tokens, TTL, SHAPE);
    let learning = call(1, 10).await.unwrap();
    assert_eq!(learning.tokens, 0, "{learning:?}");
    assert!(learning.learning_until_ms > learning.now_ms, "{learning:?}");
    assert!(learning.wait_ms >= TTL - 50, "{learning:?}");
    tokio::time::sleep(Duration::from_millis(learning.wait_ms + 1_100)).await;
    refilled_since_learning(&call(2, 10).await.unwrap(), &learning);
}

/// A key whose ledger shares `key`'s hash slot.
fn slot_mate(key: &str) -> String {
    let slot = ratelimit_bridge::store::slot::slot(key.as_bytes());
    (0..)
        .map(|i| format!("rl:g:mate-{i}"))
        .find(|k| ratelimit_bridge::store::slot::slot(k.as_bytes()) == slot)
        .unwrap()
}

fn redis<T: redis::FromRedisValue>(valkey: &Valkey, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut valkey.connection()).unwrap()
}

#[tokio::test]
async fn a_promoted_replica_that_never_had_a_ledger_grants_nothing_until_a_lease_is_over() {
    // Issue 49, row 6: a replica older than a lease, which stopped copying before the key's
    // ledger was written, promoted while the old primary's leases are spent.
    // In a directory of their own: the primary's snapshot for the replica must not be left
    // where another test's server would load it.
    let dir = std::env::temp_dir().join(format!("ratelimit-ledger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.to_str().unwrap();
    let primary = Valkey::start_with(&["--dir", dir]);
    let replica = Valkey::start_with(&["--dir", dir]);
    let port = primary.port.to_string();
    let _: () = redis(&replica, &["REPLICAOF", "127.0.0.1", &port]);
    for _ in 0..100 {
        let info: String = redis(&replica, &["INFO", "replication"]);
        if info.contains("master_link_status:up") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _: () = redis(&replica, &["REPLICAOF", "NO", "ONE"]);
    tokio::time::sleep(Duration::from_millis(1_100)).await; // older than a lease
    let store = store(&replica);
    learns(&store, "rl:g:k").await;
    // Its slot's epoch has seen this server's history for longer than a lease: another
    // key missing there never had a lease from another server, and starts full.
    let mate = slot_mate("rl:g:k");
    let full = call(&store, &mate, Mode::Grant, "b/1", 1, 60, TTL, SHAPE).await;
    assert_eq!(full.unwrap().tokens, 60);
    // A key of another slot was never seen missing: it learns, once.
    learns(&store, "rl:g:elsewhere").await;
}

#[tokio::test]
async fn a_flushed_home_grants_nothing_for_a_ledger_it_lost_until_a_lease_is_over() {
    let (valkey, store) = settled_valkey().await;
    assert_eq!(grant(&store, "a/1", 1, 50).await.tokens, 50);
    let _: () = redis(&valkey, &["FLUSHALL"]);
    learns(&store, "rl:g:k").await;
}

#[tokio::test]
async fn a_home_that_evicted_keys_grants_nothing_for_a_ledger_it_lost_until_a_lease_is_over() {
    let (valkey, store) = settled_valkey().await;
    assert_eq!(grant(&store, "a/1", 1, 50).await.tokens, 50);
    // Evictions (of junk: which key goes is random), then the ledger gone as if evicted.
    let _: () = redis(
        &valkey,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    let filler = "x".repeat(10_000);
    for i in 0..200 {
        let _: () = redis(&valkey, &["SET", &format!("junk-{i}"), &filler]);
    }
    let used: String = redis(&valkey, &["INFO", "memory"]);
    let used = (used.lines())
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap();
    let _: () = redis(
        &valkey,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    );
    let _: () = redis(&valkey, &["SET", "one-more", "x"]);
    let _: () = redis(&valkey, &["CONFIG", "SET", "maxmemory", "0"]);
    let stats: String = redis(&valkey, &["INFO", "stats"]);
    assert!(!stats.contains("evicted_keys:0\r"), "{stats}");
    let _: () = redis(&valkey, &["DEL", &ledger_key("rl:g:k")]);
    learns(&store, "rl:g:k").await;
}

#[tokio::test]
async fn a_server_younger_than_a_lease_grants_nothing_for_a_key_it_does_not_have() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // A restart without persistence loses the ledger, not the leases bridges still hold.
    // Leases of 3 s: the server (its uptime in whole seconds) is younger than one for at
    // least 2 s after it started, however slowly this test gets to ask.
    let young = ledger_for(&store, Mode::Grant, "a/1", 1, 10, 3_000).await;
    assert_eq!(young.tokens, 0, "{young:?}");
    assert!(young.learning_until_ms > 0);
    // Drained too, refilled since learning's end (a token a second).
    tokio::time::sleep(Duration::from_millis(young.wait_ms + 1_100)).await;
    refilled_since_learning(&grant(&store, "a/1", 2, 10).await, &young);
}

#[tokio::test]
async fn a_holder_that_is_not_one_word_of_the_bridges_alphabet_is_refused_before_anything_is_written(
) {
    let (_valkey, store) = settled_valkey().await;
    // A space would split the stored state: `x 1 0 9999999999999` is a lease of its making.
    for holder in ["x 1 0 9999999999999", "", "a\tb", &"h".repeat(65)] {
        let refused = call(&store, "rl:g:k", Mode::Grant, holder, 1, 5, TTL, SHAPE).await;
        assert!(refused.is_err(), "{holder:?}: {refused:?}");
        let refused = call(&store, "rl:g:k", Mode::Return, holder, 1, 5, TTL, SHAPE).await;
        assert!(refused.is_err(), "{holder:?}: {refused:?}");
    }
    let r = read(&store).await;
    assert_eq!((r.level, r.outstanding, r.leases), (100, 0, 0));
    assert_eq!(grant(&store, "eu-west/00ff", 1, 5).await.tokens, 5);
}
