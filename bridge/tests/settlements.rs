//! Metered rules' settlements in the token bucket script on a real Valkey (and a Cluster):
//! unused reservations go back up to the burst, extra usage is taken past 0 down to the
//! debt bound, a bucket in debt denies until the refill repays it, and a settlement sent
//! twice (its reply lost) is applied once, on one server and across a Cluster's nodes;
//! `usage` shows a debt as tokens owed, and reading it writes nothing (a check of a bucket
//! in debt would count a denial, so that looking blocked the client).

use crate::common::buckets::{options, redis_now_ms, rule, run, store};
use crate::common::cluster::{node_of, Cluster};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::doors::usage;
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::store::check::{RuleOutcome, RuleSpec};
use ratelimit_bridge::store::Store;
use ratelimit_protocol::{Block, Settle};

/// 100 tokens, one a minute: what a test takes stays taken.
fn tokens(key: &str, cost: u64) -> RuleSpec {
    rule(key, 100, 1, 60_000, cost)
}

fn settling(key: &str, delta: i64, debt: u64, id: &str) -> RuleSpec {
    RuleSpec {
        cost: 0,
        settle: Some(Settle {
            delta,
            debt,
            id: id.into(),
        }),
        ..tokens(key, 0)
    }
}

async fn settle(store: &Store, rules: Vec<RuleSpec>) -> Vec<RuleOutcome> {
    let mut out = store.settle_all(&[rules]).await;
    out.remove(0).unwrap().1
}

fn level(out: &RuleOutcome) -> i64 {
    out.remaining as i64 - out.owed as i64
}

#[tokio::test]
async fn unused_reservations_go_back_and_extra_usage_is_taken_into_bounded_debt() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // A reservation of 40, of which 25 were used: 15 back.
    assert!(run(&store, &[tokens("rl:t:a", 40)]).await.1[0].allowed);
    let out = settle(&store, vec![settling("rl:t:a", -15, 50, "a1")]).await;
    assert_eq!((level(&out[0]), out[0].borrowed), (75, 0));
    // Given back past the burst: the bucket is full, no more.
    let out = settle(&store, vec![settling("rl:t:a", -90, 50, "a2")]).await;
    assert_eq!(level(&out[0]), 100);
    // 130 more than reserved: 100 held, 30 on credit.
    let out = settle(&store, vec![settling("rl:t:a", 130, 50, "a3")]).await;
    assert_eq!(
        (out[0].remaining, out[0].owed, out[0].borrowed),
        (0, 30, 30)
    );
    // Past the debt bound: down to -50, never further.
    let out = settle(&store, vec![settling("rl:t:a", 45, 50, "a4")]).await;
    assert_eq!((out[0].owed, out[0].borrowed), (50, 20));
    let out = settle(&store, vec![settling("rl:t:a", 10, 50, "a5")]).await;
    assert_eq!((out[0].owed, out[0].borrowed), (50, 0));
    // In debt, a check is denied, answers 0 left (never a negative count), and waits for
    // the refill to repay the debt and the cost: 51 minutes at a token a minute.
    let denied = run(&store, &[tokens("rl:t:a", 1)]).await.1;
    assert!(!denied[0].allowed);
    assert_eq!(denied[0].remaining, 0);
    let minutes = denied[0].wait_ms.div_ceil(60_000);
    assert!((50..=51).contains(&minutes), "{denied:?}");
    // Giving back brings a bucket in debt up, not to full.
    let out = settle(&store, vec![settling("rl:t:a", -20, 50, "a6")]).await;
    assert_eq!((out[0].owed, out[0].borrowed), (30, 0));
}

#[tokio::test]
async fn a_settlement_sent_again_is_applied_once() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let twice = vec![
        settling("rl:t:b", 30, 0, "b1"),
        settling("rl:u:b", -5, 0, "b1"),
    ];
    assert!(run(&store, &[tokens("rl:u:b", 10)]).await.1[0].allowed);
    let first = settle(&store, twice.clone()).await;
    assert_eq!((level(&first[0]), level(&first[1])), (70, 95));
    for _ in 0..3 {
        let again = settle(&store, twice.clone()).await;
        assert_eq!((level(&again[0]), level(&again[1])), (70, 95), "{again:?}");
    }
    // Another id is another settlement; and in one batch, one id's rules apply once.
    let next = settle(&store, vec![settling("rl:t:b", 30, 0, "b2")]).await;
    assert_eq!(level(&next[0]), 40);
    let same = store
        .settle_all(&[
            vec![settling("rl:t:b", 10, 0, "b3")],
            vec![settling("rl:t:b", 10, 0, "b3")],
        ])
        .await;
    let levels: Vec<i64> = same
        .iter()
        .map(|o| level(&o.as_ref().unwrap().1[0]))
        .collect();
    assert_eq!(levels, [30, 30]);
}

#[tokio::test]
async fn a_settlement_spanning_cluster_nodes_is_applied_once_on_each() {
    let cluster = Cluster::start(None, None);
    let store = Store::cluster(&[cluster.seed()], options()).unwrap();
    // Keys on three different nodes.
    let mut keys: Vec<String> = Vec::new();
    for i in 0.. {
        let key = format!("rl:t:{i}");
        if !keys.iter().any(|k| node_of(k) == node_of(&key)) {
            keys.push(key);
        }
        if keys.len() == 3 {
            break;
        }
    }
    let rules: Vec<RuleSpec> = keys.iter().map(|k| settling(k, 12, 0, "c1")).collect();
    for _ in 0..3 {
        let out = settle(&store, rules.clone()).await;
        let levels: Vec<i64> = out.iter().map(level).collect();
        assert_eq!(levels, [88, 88, 88], "{out:?}");
    }
}

/// `tokens` as `usage` reads it: its rule's block too, so that a block would show.
fn watched(key: &str) -> RuleSpec {
    RuleSpec {
        block: Some(Block {
            after: 3,
            within_ms: 60_000,
            for_ms: 900_000,
        }),
        ..tokens(key, 0)
    }
}

/// Every key of `server` with its value and the Redis time it expires, as stored.
fn snapshot(server: &Valkey) -> Vec<(String, Vec<u8>, i64)> {
    let mut conn = server.connection();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let dump = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
            let expires = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            (key, dump, expires)
        })
        .collect()
}

/// `usage`'s numbers for `spec`: limit, remaining, owed, and whether a block shows.
async fn usage_of(store: &Store, spec: RuleSpec) -> (u64, u64, u64, bool) {
    let usage = usage::read(&Engine::new(store.clone(), None), "rl", "t", spec)
        .await
        .unwrap();
    let number = |field: &str| usage[field].as_u64().unwrap();
    let numbers = (number("limit"), number("remaining"), number("owed"));
    (numbers.0, numbers.1, numbers.2, !usage["blocked"].is_null())
}

#[tokio::test]
async fn usage_shows_a_bucket_in_debt_as_tokens_owed() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 130 used of a full 100: 30 owed, repaid and the bucket full again after 130 minutes
    // at a token a minute.
    settle(&store, vec![settling("rl:t:o", 130, 50, "o1")]).await;
    let now_s = redis_now_ms(&valkey) / 1000;
    let usage = usage::read(
        &Engine::new(store.clone(), None),
        "rl",
        "t",
        tokens("rl:t:o", 0),
    )
    .await
    .unwrap();
    assert_eq!(usage["remaining"], 0, "{usage}");
    assert_eq!(usage["owed"], 30, "{usage}");
    assert_eq!(usage["limit"], 100, "{usage}");
    assert!(usage["blocked"].is_null(), "{usage}");
    let reset = usage["reset"].as_u64().unwrap() - now_s;
    assert!((7_799..=7_801).contains(&reset), "{usage}");
    // Half of it given back: 15 owed; all of it and more: none, 5 left.
    settle(&store, vec![settling("rl:t:o", -15, 50, "o2")]).await;
    assert_eq!(
        usage_of(&store, tokens("rl:t:o", 0)).await,
        (100, 0, 15, false)
    );
    settle(&store, vec![settling("rl:t:o", -20, 50, "o3")]).await;
    assert_eq!(
        usage_of(&store, tokens("rl:t:o", 0)).await,
        (100, 5, 0, false)
    );
}

/// Reads the usage of `key` (130 used of a full 100, 30 owed; its rule blocks after 3
/// denials) 50 times: each shows the debt and no block, `state` (every key of the store's
/// servers) is as before, and the client's next request is denied for the debt, not
/// blocked. A check of a bucket in debt, which usage once sent, counts a denial.
async fn fifty_reads_of_a_debt<S: PartialEq + std::fmt::Debug>(
    store: &Store,
    key: &str,
    state: impl Fn() -> S,
) {
    let before = state();
    for i in 0..50 {
        let usage = usage_of(store, watched(key)).await;
        assert_eq!(usage, (100, 0, 30, false), "read {i}");
    }
    // Nothing was written: not the bucket, not its expiry, no other key.
    assert_eq!(state(), before);
    let (_, out) = run(store, &[watched(key)]).await;
    assert!(!out[0].allowed && !out[0].blocked, "{out:?}");
}

#[tokio::test]
async fn reading_the_usage_of_a_client_in_debt_50_times_never_blocks_it() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    settle(&store, vec![settling("rl:t:d", 130, 50, "d1")]).await;
    fifty_reads_of_a_debt(&store, "rl:t:d", || snapshot(&valkey)).await;
}

#[tokio::test]
async fn on_a_cluster_usage_shows_a_debt_and_50_reads_never_block() {
    let cluster = Cluster::start(None, None);
    let store = Store::cluster(&[cluster.seed()], options()).unwrap();
    settle(&store, vec![settling("rl:t:c", 130, 50, "c2")]).await;
    let nodes = || {
        (0..3)
            .map(|i| snapshot(cluster.node(i)))
            .collect::<Vec<_>>()
    };
    fifty_reads_of_a_debt(&store, "rl:t:c", nodes).await;
}
