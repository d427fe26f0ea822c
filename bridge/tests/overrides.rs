//! Emergency overrides on a real Valkey, as the bridge applies them (the records written
//! by `registry`, the table a bridge reads, its rules rewritten by `Table::apply`): while an
//! override is in force its own bucket decides, and when it ends the client is where its
//! normal rule would have left it, neither drained by a tightening nor made richer by a
//! loosening (issue 22 row 10); `usage` shows an override in force, on one server and on a
//! Cluster, starting nothing.

use crate::common::buckets::{options, rule, store};
use crate::common::cluster::{node_of, Cluster};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::doors::usage;
use ratelimit_bridge::engine::overrides::registry;
use ratelimit_bridge::engine::overrides::table::Table;
use ratelimit_bridge::engine::overrides::{parse_spec, Target};
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::store::check::RuleSpec;
use ratelimit_bridge::store::Store;
use std::time::Duration;

/// 100 an hour for `user` (one token every 36 s: a test's few seconds refill nothing).
fn per_user(user: &str) -> RuleSpec {
    rule(&format!("rl:per-user:{user}"), 100, 1, 36_000, 1)
}

/// Sets an override of `user`'s bucket; the table a bridge would read now.
async fn set(store: &Store, user: &str, requests: u64, per: &str, ttl: &str) -> Table {
    let target = Target::new("rl", "per-user", &[user.into()]).unwrap();
    let (limit, ttl_ms) = parse_spec(requests, per, None, ttl).unwrap();
    registry::set(store, target, limit, ttl_ms).await.unwrap();
    Table::new(registry::list(store, "rl").await.unwrap())
}

/// Sends `n` requests of `rule` under `table`, as a bridge would; how many were admitted.
async fn admitted(store: &Store, table: &Table, rule: &RuleSpec, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let mut check = vec![rule.clone()];
        table.apply(&mut check);
        admitted += usize::from(store.check(&check).await.unwrap().1[0].allowed);
    }
    admitted
}

/// What `usage` says is left of `user`'s bucket.
async fn remaining(store: &Store, user: &str) -> u64 {
    let spec = RuleSpec {
        cost: 0,
        ..per_user(user)
    };
    let usage = usage::read(&Engine::new(store.clone(), None), "rl", "per-user", spec)
        .await
        .unwrap();
    usage["remaining"].as_u64().unwrap()
}

#[tokio::test]
async fn a_tightening_override_that_ends_leaves_the_client_its_normal_tokens() {
    // The row's scenario: 100 an hour; alice sends 3; an override of 2 an hour (here for
    // 1.5 s rather than 4); she sends 4 more, 2 admitted; then it expires.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let alice = per_user("alice");
    let none = Table::default();
    assert_eq!(admitted(&store, &none, &alice, 3).await, 3);
    let table = set(&store, "alice", 2, "1h", "1500ms").await;
    assert_eq!(
        admitted(&store, &table, &alice, 4).await,
        2,
        "the override decides"
    );
    assert_eq!(remaining(&store, "alice").await, 0, "of the override's 2");
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(registry::list(&store, "rl").await.unwrap().is_empty());
    // Over: what the rule leaves after the 5 admitted, not the override's empty bucket.
    assert_eq!(remaining(&store, "alice").await, 95);
    let (_, out) = store.check(&vec![alice]).await.unwrap();
    assert!(out[0].allowed, "{out:?}");
    assert_eq!(out[0].remaining, 94);
}

#[tokio::test]
async fn a_loosening_override_mints_no_tokens_for_after_it() {
    // bob has 10 of his 100 left; 1000 a minute for 1.5 s lets him through (its bucket
    // refilling meanwhile), and when it ends he has what his rule leaves: 10 less what he
    // sent, never more.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let bob = per_user("bob");
    let none = Table::default();
    assert_eq!(admitted(&store, &none, &bob, 90).await, 90);
    let table = set(&store, "bob", 1000, "1m", "1500ms").await;
    assert_eq!(admitted(&store, &table, &bob, 1).await, 1);
    // 600 ms at 1000 a minute refill the override's bucket by 10 tokens.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(admitted(&store, &table, &bob, 5).await, 5);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(registry::list(&store, "rl").await.unwrap().is_empty());
    assert_eq!(remaining(&store, "bob").await, 4, "10 less the 6 admitted");
}

#[tokio::test]
async fn under_a_faster_override_the_normal_bucket_never_denies_and_ends_empty() {
    // carol spent all 100; an override of the same burst but 1000 a minute starts with
    // her tokens (none) at her first request under it, and refills a token every 60 ms,
    // which admits her although her rule's bucket is empty; afterwards it still is.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let carol = per_user("carol");
    let none = Table::default();
    assert_eq!(admitted(&store, &none, &carol, 101).await, 100);
    let target = Target::new("rl", "per-user", &["carol".into()]).unwrap();
    let (limit, ttl_ms) = parse_spec(1000, "1m", Some(100), "1500ms").unwrap();
    registry::set(&store, target, limit, ttl_ms).await.unwrap();
    let table = Table::new(registry::list(&store, "rl").await.unwrap());
    assert_eq!(admitted(&store, &table, &carol, 1).await, 0, "no token yet");
    // Denied, it was written all the same: 400 ms later it has refilled.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let under = admitted(&store, &table, &carol, 10).await;
    assert!(
        (5..=8).contains(&under),
        "{under} admitted at 1000 a minute"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(remaining(&store, "carol").await, 0);
    assert_eq!(admitted(&store, &none, &carol, 1).await, 0);
}

#[tokio::test]
async fn a_larger_burst_adds_its_room_and_what_was_spent_stays_spent() {
    // gina spent 90 of 100; 1000 a minute with a burst of 1000 gives her the 900 more
    // room at once (910), a fresh client the whole 1000; when it ends gina has her rule's
    // 10 less what she sent, never below 0.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let (gina, hugo) = (per_user("gina"), per_user("hugo"));
    let none = Table::default();
    assert_eq!(admitted(&store, &none, &gina, 90).await, 90);
    set(&store, "gina", 1000, "1m", "2s").await;
    let table = set(&store, "hugo", 1000, "1m", "2s").await;
    let (_, out) = store.check(&applied(&table, &gina)).await.unwrap();
    assert_eq!(out[0].remaining, 909);
    let (_, out) = store.check(&applied(&table, &hugo)).await.unwrap();
    assert_eq!(out[0].remaining, 999);
    assert_eq!(admitted(&store, &table, &gina, 20).await, 20);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(
        remaining(&store, "gina").await,
        0,
        "10 less 21, not below 0"
    );
    assert_eq!(remaining(&store, "hugo").await, 99);
}

/// `user` spent 90 of 100; an override with a burst of 1000 that no check has used yet:
/// usage shows the bucket the next check will start (910 of 1000), and reading it starts
/// nothing (`dump`: the bucket's value as stored), so the check finds the same.
async fn usage_reads_an_unused_override_as_a_check_would_start_it(
    store: &Store,
    user: &str,
    dump: impl Fn() -> Vec<u8>,
) {
    let spec = per_user(user);
    assert_eq!(admitted(store, &Table::default(), &spec, 90).await, 90);
    let table = set(store, user, 1000, "1m", "1m").await;
    let before = dump();
    for _ in 0..3 {
        let zero = RuleSpec {
            cost: 0,
            ..spec.clone()
        };
        let usage = usage::read(&Engine::new(store.clone(), None), "rl", "per-user", zero)
            .await
            .unwrap();
        assert_eq!(usage["limit"], 1000, "{usage}");
        assert_eq!(usage["remaining"], 910, "{usage}");
        assert_eq!(usage["owed"], 0, "{usage}");
        assert_eq!(usage["override"]["burst"], 1000, "{usage}");
    }
    assert_eq!(dump(), before, "no override's bucket written");
    let (_, out) = store.check(&applied(&table, &spec)).await.unwrap();
    assert_eq!(out[0].remaining, 909);
    assert_eq!(remaining(store, user).await, 909);
}

#[tokio::test]
async fn usage_reads_the_override_in_force_as_a_check_would_start_it_and_writes_nothing() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let dump = || -> Vec<u8> {
        redis::cmd("DUMP")
            .arg("rl:per-user:ivan")
            .query(&mut valkey.connection())
            .unwrap()
    };
    usage_reads_an_unused_override_as_a_check_would_start_it(&store, "ivan", dump).await;
}

#[tokio::test]
async fn on_a_cluster_usage_reads_the_override_in_force_and_writes_nothing() {
    let cluster = Cluster::start(None, None);
    let store = Store::cluster(&[cluster.seed()], options()).unwrap();
    let key = "rl:per-user:judy";
    let dump = || -> Vec<u8> { cluster.cmd(node_of(key), redis::cmd("DUMP").arg(key)) };
    usage_reads_an_unused_override_as_a_check_would_start_it(&store, "judy", dump).await;
}

/// `rule` as a bridge with `table` sends it.
fn applied(table: &Table, rule: &RuleSpec) -> Vec<RuleSpec> {
    let mut check = vec![rule.clone()];
    table.apply(&mut check);
    check
}

#[tokio::test]
async fn a_denial_under_an_override_waits_no_longer_than_the_override_lasts() {
    // 2 an hour would make the third request wait 30 minutes; the override ends in 3 s,
    // and then the rule's bucket (97 left) admits: the wait (what gateways cache and
    // Retry-After says) ends with the override.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let dave = per_user("dave");
    let table = set(&store, "dave", 2, "1h", "3s").await;
    assert_eq!(admitted(&store, &table, &dave, 2).await, 2);
    let mut check = vec![dave.clone()];
    table.apply(&mut check);
    let (_, out) = store.check(&check).await.unwrap();
    assert!(!out[0].allowed);
    assert!((2_000..=3_000).contains(&out[0].wait_ms), "{out:?}");
    assert_eq!(out[0].remaining, 0, "the override's bucket answers");
}

#[tokio::test]
async fn an_override_replaced_before_it_ends_passes_its_tokens_on() {
    // erin used 1 of 2; the operator replaces the override with 5 an hour: she has the 1
    // token she had (read in the new override's units), not a fresh start from her 98.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let erin = per_user("erin");
    let table = set(&store, "erin", 2, "1h", "1m").await;
    assert_eq!(admitted(&store, &table, &erin, 1).await, 1);
    let replaced = set(&store, "erin", 5, "1h", "2m").await;
    assert_eq!(admitted(&store, &replaced, &erin, 3).await, 1);
}

#[tokio::test]
async fn no_lease_is_taken_under_an_override_and_a_refund_goes_back_to_both_buckets() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let leasing = RuleSpec {
        lease: 10,
        ..per_user("frank")
    };
    let table = set(&store, "frank", 20, "1h", "1m").await;
    let mut check = vec![leasing];
    table.apply(&mut check);
    let (_, out) = store.check(&check).await.unwrap();
    assert!(out[0].allowed);
    assert_eq!((out[0].leased, out[0].remaining), (0, 19), "{out:?}");
    // What a Redis Cluster refunds when another node denied the check (the script's
    // `refund` mode, which lease returns run in too).
    let refund = vec![RuleSpec {
        lease: 0,
        ..check[0].clone()
    }];
    let back = store.return_leases(&[refund]).await;
    assert_eq!(back[0].as_ref().unwrap().1[0].remaining, 20);
    registry::clear(
        &store,
        &Target::new("rl", "per-user", &["frank".into()]).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        remaining(&store, "frank").await,
        100,
        "and the rule's bucket"
    );
}

#[tokio::test]
async fn a_record_holds_its_expiry_in_digits_however_far_it_is() {
    // The script writes the expiry itself: as Lua's %.14g, an expiry of 15 digits or more
    // became `3.17e+14`, a record no bridge reads (issue 38 row 8). The callers bound the
    // lifetime to a year; the record is readable past that bound all the same.
    let valkey = Valkey::start();
    let store = store(&valkey);
    let target = Target::new("rl", "per-user", &["dave".into()]).unwrap();
    let (limit, _) = parse_spec(1000, "1s", None, "1h").unwrap();
    let ttl_ms = 10_000 * ratelimit_bridge::engine::overrides::MAX_TTL_MS;
    let set = registry::set(&store, target, limit, ttl_ms).await.unwrap();
    let listed = registry::list(&store, "rl").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].expires_ms, set.expires_ms);
    assert!(set.expires_ms > ttl_ms);
}
