//! The store in Redis Cluster mode, on a one-node Valkey Cluster holding every slot: a
//! batch costs one script call per slot, and a check spanning slots stays all-or-nothing
//! through refunds even when other checks of the batch share its buckets. (Several nodes,
//! failover and node routing are the testbed's `test_cluster.py`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::cluster::OneNodeCluster;
use ratelimit_bridge::slot::slot;
use ratelimit_bridge::store::{Store, StoreOptions};
use ratelimit_bridge::wire::{Check, RuleSpec};
use std::time::Duration;

fn rule(key: &str, burst: u64) -> RuleSpec {
    RuleSpec {
        key: key.into(),
        burst,
        num: 1,
        den: 3_600_000,
        cost: 1,
    }
}

#[tokio::test]
async fn a_check_denied_in_one_slot_is_refunded_in_the_others_within_a_batch() {
    let node = OneNodeCluster::start();
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    };
    let store = Store::cluster(&[node.url()], options).unwrap();
    let (roomy, tight) = (rule("{a}user", 10), rule("{b}ip", 1));
    assert_ne!(slot(roomy.key.as_bytes()), slot(tight.key.as_bytes()));
    let warm = store.check(&vec![rule("{a}warm-up", 1)]).await.unwrap();
    assert!(warm.1[0].allowed, "the script is loaded");
    let _: () = node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));

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
    // The second check is denied by {b}; {a} admitted its part and gave it back.
    assert_eq!(allowed, [vec![true, true], vec![true, false], vec![true]]);
    // {a}'s call applied the three parts in order (9, 8, 7 left), then the refund: 8.
    assert_eq!(out[2].1[0].remaining, 7);
    assert_eq!(
        out[1].1[0].remaining, 8,
        "the refunded rule reports its bucket"
    );
    let value: Vec<u8> = node.cmd(redis::cmd("GET").arg("{a}user"));
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units as u64 / 3_600_000, 8);
    // One call per slot, then one refund call.
    let info: String = node.cmd(redis::cmd("INFO").arg("commandstats"));
    assert!(
        info.contains("cmdstat_evalsha:calls=3,"),
        "{}",
        info.lines().find(|l| l.contains("evalsha")).unwrap_or("")
    );
}
