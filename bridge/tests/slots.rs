//! In-flight rules' slots in the token bucket script on a real Valkey: a set admits `burst`
//! requests at once and refuses the next until one is given back (a lease return) or
//! expires unrenewed; a check is all-or-nothing across slots and buckets; a check sent
//! again holds its one slot; a renewal (a settlement) extends a slot and never brings back
//! one released; a key of another type is never touched.

use crate::common::buckets::{hourly, redis_now_ms, store};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::store::check::{RuleOutcome, RuleSpec};
use ratelimit_bridge::store::Store;
use ratelimit_protocol::slot::{Slot, SLOT_RETRY_MS};
use ratelimit_protocol::Settle;

const TTL_MS: u64 = 30_000;

/// Request `id`'s slot in the set `key` of `max` slots.
fn slot(key: &str, max: u64, id: &str) -> RuleSpec {
    RuleSpec {
        slot: Some(Slot {
            ttl_ms: TTL_MS,
            id: id.into(),
        }),
        ..RuleSpec::plain(key, max, max, TTL_MS, 1)
    }
}

fn renewal(key: &str, max: u64, id: &str) -> RuleSpec {
    RuleSpec {
        cost: 0,
        settle: Some(Settle {
            delta: 0,
            debt: 0,
            id: id.into(),
        }),
        ..slot(key, max, id)
    }
}

async fn check(store: &Store, rules: Vec<RuleSpec>) -> Result<Vec<RuleOutcome>, String> {
    store.check(&rules).await.map(|(_, rules)| rules)
}

async fn release(store: &Store, rule: RuleSpec) -> RuleOutcome {
    let mut out = store.return_leases(&[vec![rule]]).await;
    out.remove(0).unwrap().1.remove(0)
}

async fn renew(store: &Store, rule: RuleSpec) -> RuleOutcome {
    let mut out = store.settle_all(&[vec![rule]]).await;
    out.remove(0).unwrap().1.remove(0)
}

/// The slots `key` holds, each with its expiry (Redis ms).
fn held(valkey: &Valkey, key: &str) -> Vec<(String, u64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut valkey.connection())
        .unwrap()
}

fn expire_at(valkey: &Valkey, key: &str, id: &str, at_ms: u64) {
    let _: () = redis::cmd("ZADD")
        .arg(key)
        .arg("XX")
        .arg(at_ms)
        .arg(id)
        .query(&mut valkey.connection())
        .unwrap();
}

#[tokio::test]
async fn a_set_admits_its_most_and_a_release_makes_room() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:streams:alice";
    let one = check(&store, vec![slot(key, 2, "r1")]).await.unwrap();
    assert_eq!((one[0].allowed, one[0].remaining), (true, 1));
    let two = check(&store, vec![slot(key, 2, "r2")]).await.unwrap();
    assert_eq!((two[0].allowed, two[0].remaining), (true, 0));
    let three = check(&store, vec![slot(key, 2, "r3")]).await.unwrap();
    assert_eq!(
        (three[0].allowed, three[0].remaining, three[0].wait_ms),
        (false, 0, SLOT_RETRY_MS)
    );
    // An id held already is refused (a caller reusing a live request's id), taking nothing.
    release(&store, slot(key, 2, "r1")).await;
    let again = check(&store, vec![slot(key, 2, "r2")]).await.unwrap();
    assert_eq!((again[0].allowed, again[0].wait_ms), (false, SLOT_RETRY_MS));
    assert_eq!(held(&valkey, key).len(), 1);
    check(&store, vec![slot(key, 2, "r1")]).await.unwrap();
    let now = redis_now_ms(&valkey);
    for (_, expires) in held(&valkey, key) {
        assert!(
            expires > now && expires <= now + TTL_MS,
            "{expires} vs {now}"
        );
    }
    let released = release(&store, slot(key, 2, "r1")).await;
    assert_eq!(released.remaining, 1);
    // Released twice (sent again): nothing more comes back.
    assert_eq!(release(&store, slot(key, 2, "r1")).await.remaining, 1);
    let three = check(&store, vec![slot(key, 2, "r3")]).await.unwrap();
    assert!(three[0].allowed);
    let ids: Vec<String> = held(&valkey, key).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["r2", "r3"]);
    // Another client's set is its own.
    assert!(
        check(&store, vec![slot("rl:streams:bob", 2, "r4")])
            .await
            .unwrap()[0]
            .allowed
    );
}

#[tokio::test]
async fn a_check_takes_its_slot_and_its_tokens_together_or_neither() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let (set, bucket) = ("rl:streams:alice", "rl:rate:alice");
    // The bucket lacks the cost: the slot is not taken.
    check(&store, vec![hourly(bucket, 1)]).await.unwrap();
    let denied = check(&store, vec![slot(set, 1, "r1"), hourly(bucket, 1)])
        .await
        .unwrap();
    assert_eq!((denied[0].allowed, denied[1].allowed), (true, false));
    assert!(held(&valkey, set).is_empty());
    // The set is full: the bucket is not charged.
    let roomy = "rl:rate:bob";
    check(&store, vec![slot(set, 1, "r2")]).await.unwrap();
    let denied = check(&store, vec![slot(set, 1, "r3"), hourly(roomy, 5)])
        .await
        .unwrap();
    assert_eq!((denied[0].allowed, denied[1].allowed), (false, true));
    let left = check(&store, vec![hourly(roomy, 5)]).await.unwrap();
    assert_eq!(
        left[0].remaining, 4,
        "one token taken by this check, none by the denied one"
    );
}

#[tokio::test]
async fn a_renewal_extends_a_slot_and_never_brings_back_a_released_one() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:streams:alice";
    check(&store, vec![slot(key, 2, "r1")]).await.unwrap();
    let soon = redis_now_ms(&valkey) + 500;
    expire_at(&valkey, key, "r1", soon);
    let renewed = renew(&store, renewal(key, 2, "r1")).await;
    assert!(renewed.allowed);
    let expires = held(&valkey, key)[0].1;
    assert!(expires > soon + 20_000, "renewed to {expires}, from {soon}");
    release(&store, slot(key, 2, "r1")).await;
    let late = renew(&store, renewal(key, 2, "r1")).await;
    assert_eq!(late.remaining, 2, "the set stays empty");
    assert!(held(&valkey, key).is_empty());
}

#[tokio::test]
async fn a_slot_no_one_renews_is_gone_after_its_life() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:streams:alice";
    check(&store, vec![slot(key, 1, "dead")]).await.unwrap();
    assert!(!check(&store, vec![slot(key, 1, "r2")]).await.unwrap()[0].allowed);
    // The gateway holding it died: no renewal, and its life runs out.
    expire_at(&valkey, key, "dead", redis_now_ms(&valkey) - 1);
    assert!(check(&store, vec![slot(key, 1, "r2")]).await.unwrap()[0].allowed);
    let ids: Vec<String> = held(&valkey, key).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["r2"]);
    // The set's key lives as long as its longest slot, and a little more.
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query(&mut valkey.connection())
        .unwrap();
    assert!(
        (TTL_MS as i64..=TTL_MS as i64 + 1_000).contains(&pttl),
        "{pttl}"
    );
}

#[tokio::test]
async fn a_shadow_slot_never_denies_and_takes_nothing_when_full() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:streams:alice";
    check(&store, vec![slot(key, 1, "r1")]).await.unwrap();
    let shadow = RuleSpec {
        shadow: true,
        ..slot(key, 1, "r2")
    };
    let out = check(&store, vec![shadow]).await.unwrap();
    assert!(out[0].allowed);
    assert_eq!(held(&valkey, key).len(), 1);
}

#[tokio::test]
async fn a_key_of_another_type_is_never_touched() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let _: () = redis::cmd("SET")
        .arg("rl:streams:alice")
        .arg("mine")
        .query(&mut valkey.connection())
        .unwrap();
    let out = check(&store, vec![slot("rl:streams:alice", 2, "r1")]).await;
    assert!(out.is_err(), "{out:?}");
    // A set of slots read as a bucket is foreign too.
    check(&store, vec![slot("rl:streams:bob", 2, "r1")])
        .await
        .unwrap();
    let out = check(&store, vec![hourly("rl:streams:bob", 2)]).await;
    assert!(out.is_err(), "{out:?}");
    let value: String = redis::cmd("GET")
        .arg("rl:streams:alice")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(value, "mine");
    assert_eq!(held(&valkey, "rl:streams:bob").len(), 1);
}

#[tokio::test]
async fn a_look_takes_nothing_and_says_what_is_left() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let (set, bucket) = ("rl:streams:alice", "rl:rate:alice");
    check(&store, vec![slot(set, 3, "r1"), hourly(bucket, 5)])
        .await
        .unwrap();
    let look = |rule: RuleSpec| RuleSpec {
        shadow: true,
        cost: 0,
        ..rule
    };
    for _ in 0..3 {
        let out = check(
            &store,
            vec![look(slot(set, 3, "look")), look(hourly(bucket, 5))],
        )
        .await
        .unwrap();
        assert_eq!((out[0].remaining, out[1].remaining), (2, 4));
        assert!(out.iter().all(|r| r.allowed));
    }
    assert_eq!(held(&valkey, set).len(), 1, "no slot taken by a look");
}

#[tokio::test]
async fn a_set_holding_more_than_a_lowered_most_answers_none_free_and_refuses() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:streams:alice";
    for id in ["r1", "r2", "r3", "r4"] {
        assert!(check(&store, vec![slot(key, 4, id)]).await.unwrap()[0].allowed);
    }
    // The configuration now allows 2: four still run, none is free, never a negative count
    // (which would read as a code), and the check is refused, not failed.
    let out = check(&store, vec![slot(key, 2, "r5")]).await.unwrap();
    assert_eq!((out[0].allowed, out[0].remaining), (false, 0));
    let released = release(&store, slot(key, 2, "r1")).await;
    assert_eq!(released.remaining, 0);
    let look = RuleSpec {
        shadow: true,
        cost: 0,
        ..slot(key, 2, "look")
    };
    let out = check(&store, vec![look]).await.unwrap();
    assert_eq!((out[0].allowed, out[0].remaining), (true, 0));
}
