//! The store in Redis Cluster mode, on a one-node Valkey Cluster holding every slot: a
//! batch costs one script call per slot, and a check spanning slots peeks at all of them
//! before any takes, so one that a slot denies takes nothing elsewhere, even when other
//! checks of the batch share its buckets. (Several nodes,
//! failover and node routing are the testbed's `test_cluster.py`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::cluster::OneNodeCluster;
use ratelimit_bridge::check::{Check, RuleSpec};
use ratelimit_bridge::slot::slot;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;

fn rule(key: &str, burst: u64) -> RuleSpec {
    RuleSpec::plain(key, burst, 1, 3_600_000, 1)
}

async fn store(node: &OneNodeCluster) -> Store {
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    };
    let store = Store::cluster(&[node.url()], options).unwrap();
    let warm = store.check(&vec![rule("{a}warm-up", 1)]).await.unwrap();
    assert!(warm.1[0].allowed, "the script is loaded");
    let _: () = node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));
    store
}

fn script_calls(node: &OneNodeCluster) -> String {
    let info: String = node.cmd(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .find(|l| l.contains("evalsha"))
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn a_check_denied_in_one_slot_takes_nothing_in_the_others_within_a_batch() {
    let node = OneNodeCluster::start();
    let store = store(&node).await;
    let (roomy, tight) = (rule("{a}user", 10), rule("{b}ip", 1));
    assert_ne!(slot(roomy.key.as_bytes()), slot(tight.key.as_bytes()));

    let both: Check = vec![roomy.clone(), tight];
    let out: Vec<_> = store
        .check_all(&[both.clone(), both, vec![roomy]])
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let allowed: Vec<Vec<bool>> = out
        .iter()
        .map(|(_, o)| o.iter().map(|r| r.allowed).collect())
        .collect();
    // The first check takes {b}'s only token, so the peek finds the second denied by
    // {b}: it takes nothing from {a}, where the first and third took one each.
    assert_eq!(allowed, [vec![true, true], vec![true, false], vec![true]]);
    assert_eq!(out[2].1[0].remaining, 8);
    let value: Vec<u8> = node.cmd(redis::cmd("GET").arg("{a}user"));
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units as u64 / 3_600_000, 8);
    // A peek and a take per slot, no refund.
    assert!(
        script_calls(&node).contains("calls=4,"),
        "{}",
        script_calls(&node)
    );
}

#[tokio::test]
async fn a_client_over_its_limit_never_touches_the_buckets_it_shares_elsewhere() {
    let node = OneNodeCluster::start();
    let store = store(&node).await;
    // A global bucket on one slot, this client's own (empty) bucket on another.
    let (global, own) = (rule("{g}global", 1000), rule("{u}alice", 1));
    assert!(store.check(&vec![own.clone()]).await.unwrap().1[0].allowed);
    let _: () = node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));
    for _ in 0..5 {
        let (_, out) = store
            .check(&vec![global.clone(), own.clone()])
            .await
            .unwrap();
        assert_eq!((out[0].allowed, out[1].allowed), (true, false));
    }
    // The global bucket was never written: not taken, not refunded.
    let exists: i64 = node.cmd(redis::cmd("EXISTS").arg("{g}global"));
    assert_eq!(exists, 0);
    assert!(
        script_calls(&node).contains("calls=10,"),
        "{}",
        script_calls(&node)
    );
}

#[tokio::test]
async fn a_peek_counts_denials_towards_a_block_without_keeping_what_it_took() {
    let node = OneNodeCluster::start();
    let store = store(&node).await;
    let roomy = rule("{a}user", 10);
    let tight = RuleSpec {
        block: Some(ratelimit_protocol::Block {
            after: 2,
            within_ms: 60_000,
            for_ms: 60_000,
        }),
        ..rule("{b}ip", 1)
    };
    let both: Check = vec![roomy.clone(), tight];
    // The peek finds the first check admitted and the next two denied by {b}, which
    // blocks the client at once: the first check's take then meets the block, and gives
    // back what it took in {a}.
    let out = store.check_all(&[both.clone(), both.clone(), both]).await;
    let flags: Vec<(bool, bool)> = out
        .iter()
        .map(|o| {
            let r = &o.as_ref().unwrap().1[1];
            (r.allowed, r.blocked)
        })
        .collect();
    assert_eq!(flags, [(false, true), (false, false), (false, true)]);
    let value: Vec<u8> = node.cmd(redis::cmd("GET").arg("{b}ip"));
    assert_eq!(
        (value.len(), value[0]),
        (49, 2),
        "the count and the block are kept"
    );
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units, 3_600_000.0, "no peek keeps what it took in memory");
    let a = store.check(&vec![roomy]).await.unwrap();
    assert_eq!(
        a.1[0].remaining, 9,
        "{{a}} is whole again: nothing was admitted"
    );
}
