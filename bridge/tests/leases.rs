//! Leases in the token bucket script on a real Valkey: an admitted check that asks for a
//! lease takes up to that many tokens more, as many as the bucket holds beyond its cost;
//! a lease return gives tokens back, never past the burst, and one that fills a bucket
//! leaves no key (a missing key is a full bucket). A rule in shadow mode never denies.

use crate::common::buckets::{rule, run, store, stored};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::store::check::RuleSpec;
use ratelimit_protocol::Block;

fn leasing(key: &str, burst: u64, lease: u64) -> RuleSpec {
    RuleSpec {
        lease,
        ..rule(key, burst, 1, 3_600_000, 1)
    }
}

#[tokio::test]
async fn a_lease_takes_what_the_bucket_holds_beyond_the_cost_and_a_lease_return_gives_it_back() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let hot = leasing("rl:g", 10, 4);
    let (_, out) = run(&store, std::slice::from_ref(&hot)).await;
    assert!(out[0].allowed);
    assert_eq!((out[0].leased, out[0].remaining), (4, 5), "{out:?}");
    let (_, out) = run(&store, std::slice::from_ref(&hot)).await;
    assert_eq!((out[0].leased, out[0].remaining), (4, 0), "{out:?}");
    // Nothing beyond the cost: admitted, no lease.
    let mut last = run(&store, &[rule("rl:g", 10, 1, 3_600_000, 1)]).await.1;
    assert!(!last[0].allowed);
    // 3 of the 8 leased come back.
    let back = rule("rl:g", 10, 1, 3_600_000, 3);
    let returned = store.return_leases(&[vec![back]]).await;
    assert_eq!(returned[0].as_ref().unwrap().1[0].remaining, 3);
    last = run(&store, std::slice::from_ref(&hot)).await.1;
    assert_eq!(
        (last[0].allowed, last[0].leased, last[0].remaining),
        (true, 2, 0)
    );
    // A lease return never fills a bucket past its burst.
    let all = rule("rl:g", 10, 1, 3_600_000, 10);
    for _ in 0..3 {
        store.return_leases(&[vec![all.clone()]]).await;
    }
    let after = run(&store, &[rule("rl:g", 10, 1, 3_600_000, 1)]).await.1;
    assert_eq!(after[0].remaining, 9);
}

#[tokio::test]
async fn a_denied_check_takes_no_lease() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let tight = rule("rl:t", 1, 1, 3_600_000, 1);
    assert!(run(&store, std::slice::from_ref(&tight)).await.1[0].allowed);
    let (_, out) = run(&store, &[leasing("rl:roomy", 100, 50), tight]).await;
    assert!(!out[1].allowed && out[0].leased == 0, "{out:?}");
    let (_, out) = run(&store, &[rule("rl:roomy", 100, 1, 3_600_000, 1)]).await;
    assert_eq!(out[0].remaining, 99, "nothing was taken from it");
}

#[tokio::test]
async fn a_shadow_rule_never_denies_its_check_and_takes_nothing_it_lacks() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let shadow = RuleSpec {
        shadow: true,
        ..rule("rl:s", 1, 1, 3_600_000, 1)
    };
    let roomy = rule("rl:u", 10, 1, 3_600_000, 1);
    let (_, out) = run(&store, &[roomy.clone(), shadow.clone()]).await;
    assert!(out[1].allowed && out[1].wait_ms == 0, "{out:?}");
    let (_, out) = run(&store, &[roomy.clone(), shadow.clone()]).await;
    assert!(out[0].allowed, "the check is admitted: {out:?}");
    assert!(
        out[1].allowed && out[1].wait_ms > 3_000_000,
        "would wait: {out:?}"
    );
    assert_eq!(out[0].remaining, 8, "the enforced rule took its token");
    // An enforced rule that denies still denies the check, shadow or not.
    let tight = rule("rl:t", 1, 1, 3_600_000, 1);
    assert!(run(&store, std::slice::from_ref(&tight)).await.1[0].allowed);
    let (_, out) = run(&store, &[roomy, shadow, tight]).await;
    assert!(!out[2].allowed, "{out:?}");
    let (_, out) = run(&store, &[rule("rl:u", 10, 1, 3_600_000, 1)]).await;
    assert_eq!(out[0].remaining, 7, "the denied check took nothing");
}

fn exists(valkey: &Valkey, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<u64>(&mut valkey.connection())
        .unwrap()
        == 1
}

#[tokio::test]
async fn a_lease_return_that_fills_a_bucket_leaves_no_key() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let (token, one) = (3_600_000, |key| rule(key, 5, 1, 3_600_000, 1));
    let take = rule("rl:r", 5, 1, 3_600_000, 2);
    assert!(run(&store, std::slice::from_ref(&take)).await.1[0].allowed);
    // Short of full: stored, as before.
    store.return_leases(&[vec![one("rl:r")]]).await[0]
        .as_ref()
        .unwrap();
    assert_eq!(stored(&valkey, "rl:r").unwrap().units / token, 4);
    // Full: the key is deleted, not stored full (memory held for nothing until it expired).
    let back = store.return_leases(&[vec![one("rl:r")]]).await;
    assert_eq!(back[0].as_ref().unwrap().1[0].remaining, 5);
    assert!(!exists(&valkey, "rl:r"), "a full bucket's key stays");
    // A lease return to a bucket already gone (it expired full meanwhile) writes nothing.
    store.return_leases(&[vec![one("rl:gone")]]).await[0]
        .as_ref()
        .unwrap();
    assert!(
        !exists(&valkey, "rl:gone"),
        "a lease return created a full bucket"
    );
    // Deleted is the same as full: the next check sees all 5.
    let (_, out) = run(&store, std::slice::from_ref(&take)).await;
    assert_eq!(out[0].remaining, 3);
}

#[tokio::test]
async fn a_full_bucket_that_counts_denials_keeps_its_key() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // Blocked after 3 denials within a minute: a count in force is what a missing key
    // would lose, so a lease return that fills the bucket keeps the key while it lasts.
    let login = RuleSpec {
        block: Some(Block {
            after: 3,
            within_ms: 60_000,
            for_ms: 60_000,
        }),
        ..rule("rl:login:ip", 1, 1, 3_600_000, 1)
    };
    assert!(run(&store, std::slice::from_ref(&login)).await.1[0].allowed);
    assert!(!run(&store, std::slice::from_ref(&login)).await.1[0].allowed);
    store.return_leases(&[vec![login.clone()]]).await[0]
        .as_ref()
        .unwrap();
    assert!(exists(&valkey, "rl:login:ip"));
    assert!(run(&store, std::slice::from_ref(&login)).await.1[0].allowed);
    assert!(!run(&store, std::slice::from_ref(&login)).await.1[0].blocked);
    let out = run(&store, std::slice::from_ref(&login)).await.1;
    assert!(
        out[0].blocked,
        "the third denial within the minute blocks: {out:?}"
    );
}
