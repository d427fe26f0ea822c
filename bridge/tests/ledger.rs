//! The ledger of a global rule (`lua/ledger.lua`) on a real Valkey, as the bridges call it:
//! what it holds plus what it has out on leases never passes its capacity, however grants,
//! returns, refills and expiries interleave; a grant or a return sent again is the same one;
//! a ledger written by another server, or missing on a server younger than a lease's life,
//! grants nothing until every lease the old one could have granted is over (learning).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::buckets::store;
use common::{Connect, Valkey};
use ratelimit_bridge::regions::ledger::{call, ledger_key, Mode, Reply, Shape};
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
    let learning = grant(&store, "b/1", 1, 10).await;
    assert_eq!(learning.tokens, 0);
    assert!(learning.learning_until_ms > learning.now_ms, "{learning:?}");
    assert!(learning.wait_ms >= TTL - 50, "{learning:?}");
    // And drained: the grants it may have missed took from the level. After learning, it
    // has what the refill brought since (a token a second), not the 50 it "held".
    tokio::time::sleep(Duration::from_millis(learning.wait_ms + 1_100)).await;
    let after = grant(&store, "b/1", 2, 10).await;
    assert!((1..=2).contains(&after.tokens), "{after:?}");
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
    // Drained too, refilled since (a token a second).
    tokio::time::sleep(Duration::from_millis(young.wait_ms + 1_100)).await;
    let after = grant(&store, "a/1", 2, 10).await;
    let refilled = (after.now_ms - young.now_ms) / 1_000;
    assert!(
        after.tokens <= refilled + 1 && after.tokens + 1 >= refilled,
        "{after:?}"
    );
}
