//! The store while a slot migrates from one primary to another, some of its buckets
//! already moved: the node the slot map names refuses a script a key it no longer holds,
//! and redirects each such key (`ASK`). A check of a moved bucket is then sent to the
//! target after `ASKING`, a check of a bucket still on the source stays there, a bucket
//! that did not exist yet is made on the target (where the slot is going), and a check that
//! the move splits between two nodes fails whole, taking nothing. Once the slot has moved
//! (`MOVED`), the slot map is read again and checks follow it. (The testbed's
//! `test_cluster.py` moves a slot under load through Envoy.)

use crate::common::buckets::{hourly, options, stored};
use crate::common::cluster::{node_of, Cluster};
use ratelimit_bridge::store::check::RuleSpec;
use ratelimit_bridge::store::slot::slot;
use ratelimit_bridge::store::Store;

/// A hash tag whose slot primary 0 serves, other than `not`'s.
fn tag_on_first_node(not: Option<u16>) -> String {
    (0..)
        .map(|i| format!("t{i}"))
        .find(|t| node_of(t) == 0 && Some(slot(t.as_bytes())) != not)
        .unwrap()
}

/// Tokens left in `rule`'s bucket as primary `i` stores it.
fn tokens_on(cluster: &Cluster, i: usize, rule: &RuleSpec) -> u64 {
    let bucket = stored(cluster.node(i), &rule.key).expect("the bucket is on that node");
    (bucket.units / 3_600_000) as u64
}

#[tokio::test]
async fn a_migrating_slot_sends_each_check_where_its_buckets_are() {
    let cluster = Cluster::start(None, None);
    let store = Store::cluster(&[cluster.seed()], options()).unwrap();
    let tag = tag_on_first_node(None);
    let moving = slot(tag.as_bytes());
    let other_tag = tag_on_first_node(Some(moving));
    let moved = hourly(&format!("rl:user:{{{tag}}}moved"), 10);
    let staying = hourly(&format!("rl:user:{{{tag}}}staying"), 10);
    let fresh = hourly(&format!("rl:user:{{{tag}}}fresh"), 10);
    let other = hourly(&format!("rl:user:{{{other_tag}}}other"), 10);
    for rule in [&moved, &staying, &other] {
        assert!(store.check(&vec![rule.clone()]).await.unwrap().1[0].allowed);
    }

    cluster.start_migration(moving, 0, 1);
    cluster.migrate_key(&moved.key, 0, 1);
    let out = store
        .check_all(&[
            vec![moved.clone()],
            vec![staying.clone()],
            vec![fresh.clone()],
            vec![other.clone()],
            vec![moved.clone(), other.clone()],
        ])
        .await;
    let left: Vec<Option<u64>> = out
        .iter()
        .map(|o| o.as_ref().ok().map(|(_, r)| r[0].remaining))
        .collect();
    // Each bucket where it is: the moved one on the target (one token taken before the
    // move, one now), the fresh one made there; the check the move splits fails whole.
    assert_eq!(left, [Some(8), Some(8), Some(9), Some(8), None], "{out:?}");
    let split = out[4].as_ref().unwrap_err();
    assert!(split.contains("moved apart"), "{split}");
    assert_eq!(
        tokens_on(&cluster, 0, &other),
        8,
        "the split check took nothing"
    );

    cluster.migrate_key(&staying.key, 0, 1);
    cluster.finish_migration(moving, 1);
    for (rule, tokens) in [(&moved, 8), (&staying, 8), (&fresh, 9)] {
        assert_eq!(tokens_on(&cluster, 1, rule), tokens, "{}", rule.key);
    }
    // The slot has moved: the node refuses with MOVED and the map is read again.
    let after = store.check(&vec![moved.clone(), staying]).await.unwrap();
    assert_eq!((after.1[0].remaining, after.1[1].remaining), (7, 7));
}
