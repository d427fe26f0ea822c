//! The store in Redis Cluster mode: a batch costs one script call per node whatever the
//! slots of its keys (on a one-node cluster holding every slot, cheap, for that), and on
//! three primaries a check spanning nodes stays all-or-nothing: its own buckets first, the
//! shared ones only if those admitted (peeked at first when on several nodes), so a client
//! over its own limit never touches a bucket it shares. (Failover and resharding under
//! load are the testbed's `test_cluster.py`.)

use crate::common::buckets::{hourly, options};
use crate::common::cluster::{node_of, Cluster, OneNodeCluster};
use ratelimit_bridge::store::check::{Check, RuleSpec};
use ratelimit_bridge::store::slot::slot;
use ratelimit_bridge::store::Store;

/// The `cmdstat_evalsha` line of `info` (`INFO commandstats`), or "".
fn evalsha(info: &str) -> String {
    info.lines()
        .find(|l| l.contains("evalsha"))
        .unwrap_or("")
        .to_string()
}

/// A store on three primaries, the script loaded, statistics reset on every node.
async fn three_nodes() -> (Cluster, Store) {
    let cluster = Cluster::start(None, None);
    let store = Store::cluster(&[cluster.seed()], options()).unwrap();
    for tag in ["{b}", "{c}", "{a}"] {
        let warm = store
            .check(&vec![hourly(&format!("rl:warm:{tag}"), 1)])
            .await;
        assert!(warm.unwrap().1[0].allowed, "the script is loaded");
    }
    for i in 0..3 {
        let _: () = cluster.cmd(i, redis::cmd("CONFIG").arg("RESETSTAT"));
    }
    (cluster, store)
}

fn script_calls(cluster: &Cluster, i: usize) -> String {
    evalsha(&cluster.cmd::<String>(i, redis::cmd("INFO").arg("commandstats")))
}

#[tokio::test]
async fn a_batch_over_many_slots_of_one_node_is_one_call_each_check_atomic() {
    let node = OneNodeCluster::start();
    let store = Store::cluster(&[node.url()], options()).unwrap();
    let warm = store.check(&vec![hourly("{a}warm-up", 1)]).await.unwrap();
    assert!(warm.1[0].allowed, "the script is loaded");
    let _: () = node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));
    let (roomy, tight) = (hourly("{a}user", 10), hourly("{b}ip", 1));
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
    // The first check takes {b}'s only token; the second, denied by {b}, takes nothing
    // from {a}, where the first and third took one each.
    assert_eq!(allowed, [vec![true, true], vec![true, false], vec![true]]);
    assert_eq!(out[2].1[0].remaining, 8);
    let value: Vec<u8> = node.cmd(redis::cmd("GET").arg("{a}user"));
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units as u64 / 3_600_000, 8);
    let info: String = node.cmd(redis::cmd("INFO").arg("commandstats"));
    assert!(evalsha(&info).contains("calls=1,"), "{}", evalsha(&info));
}

#[tokio::test]
async fn a_client_over_its_limit_never_touches_the_buckets_it_shares_elsewhere() {
    let (cluster, store) = three_nodes().await;
    // A global bucket on one node, this client's own (empty) bucket on another.
    let (global, own) = (
        hourly("rl:global{b}", 1000),
        hourly("rl:per-user:{c}alice", 1),
    );
    let (g, o) = (node_of(&global.key), node_of(&own.key));
    assert_ne!(g, o);
    assert!(store.check(&vec![own.clone()]).await.unwrap().1[0].allowed);
    let _: () = cluster.cmd(o, redis::cmd("CONFIG").arg("RESETSTAT"));
    for _ in 0..5 {
        let (_, out) = store
            .check(&vec![global.clone(), own.clone()])
            .await
            .unwrap();
        assert_eq!((out[0].allowed, out[1].allowed), (true, false));
        assert_eq!(out[0].remaining, 1000, "never reached: its capacity");
    }
    // The global bucket was never written, nor even called on: not taken, not refunded.
    let exists: i64 = cluster.cmd(g, redis::cmd("EXISTS").arg(&global.key));
    assert_eq!(exists, 0);
    assert_eq!(script_calls(&cluster, g), "");
    assert!(
        script_calls(&cluster, o).contains("calls=5,"),
        "{}",
        script_calls(&cluster, o)
    );
}

#[tokio::test]
async fn a_check_denied_on_one_node_gives_back_what_its_own_buckets_took_on_another() {
    let (cluster, store) = three_nodes().await;
    let (user, ip) = (
        hourly("rl:per-user:{b}alice", 10),
        hourly("rl:per-ip:{c}10.0.0.1", 1),
    );
    let (u, i) = (node_of(&user.key), node_of(&ip.key));
    assert_ne!(u, i);
    let both: Check = vec![user.clone(), ip];
    // Both are taken in parallel: the IP's only token, then, for the second check, the
    // user's token is given back when the IP's bucket denies.
    let first = store.check(&both).await.unwrap();
    assert!(first.1.iter().all(|r| r.allowed));
    let second = store.check(&both).await.unwrap();
    assert_eq!((second.1[0].allowed, second.1[1].allowed), (true, false));
    let value: Vec<u8> = cluster.cmd(u, redis::cmd("GET").arg(&user.key));
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(
        units as u64 / 3_600_000,
        9,
        "only the admitted check's token is gone"
    );
    let calls: Vec<String> = (0..3).map(|i| script_calls(&cluster, i)).collect();
    assert!(
        calls[u].contains("calls=3,"),
        "take, take, give back: {calls:?}"
    );
    assert!(calls[i].contains("calls=2,"), "{calls:?}");
}

#[tokio::test]
async fn shared_buckets_on_several_nodes_are_peeked_and_a_peek_counts_towards_a_block() {
    let (cluster, store) = three_nodes().await;
    let roomy = hourly("rl:all{b}", 10);
    let tight = RuleSpec {
        block: Some(ratelimit_protocol::Block {
            after: 2,
            within_ms: 60_000,
            for_ms: 60_000,
        }),
        ..hourly("rl:login{c}", 1)
    };
    assert_ne!(node_of(&roomy.key), node_of(&tight.key));
    let both: Check = vec![roomy.clone(), tight.clone()];
    // The peek finds the first check admitted and the next two denied by the tight
    // bucket, which blocks at once: the first check's take then meets the block, and gives
    // back what it took in the roomy one.
    let out = store.check_all(&[both.clone(), both.clone(), both]).await;
    let flags: Vec<(bool, bool)> = out
        .iter()
        .map(|o| {
            let r = &o.as_ref().unwrap().1[1];
            (r.allowed, r.blocked)
        })
        .collect();
    assert_eq!(flags, [(false, true), (false, false), (false, true)]);
    let value: Vec<u8> = cluster.cmd(node_of(&tight.key), redis::cmd("GET").arg(&tight.key));
    assert_eq!(
        (value.len(), value[0]),
        (49, 2),
        "the count and the block are kept"
    );
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units, 3_600_000.0, "no peek keeps what it took in memory");
    let a = store.check(&vec![roomy]).await.unwrap();
    assert_eq!(a.1[0].remaining, 9, "whole again: nothing was admitted");
}

/// `rule` under an override of `burst` an hour, ending a minute from now (as the bridge's
/// table puts it on a check).
fn overridden(rule: RuleSpec, burst: u64) -> RuleSpec {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    RuleSpec {
        overridden: Some(ratelimit_protocol::Overridden {
            burst,
            num: 1,
            den: 3_600_000 / burst,
            until_ms: now + 60_000,
        }),
        ..rule
    }
}

#[tokio::test]
async fn an_override_spread_over_slots_decides_and_its_rules_bucket_pays() {
    // One node, two slots: the script's spread mode (keys in ARGV).
    let node = OneNodeCluster::start();
    let store = Store::cluster(&[node.url()], options()).unwrap();
    let (user, global) = (
        hourly("rl:per-user:{a}alice", 100),
        hourly("rl:global{b}", 1000),
    );
    assert_ne!(slot(user.key.as_bytes()), slot(global.key.as_bytes()));
    let both: Check = vec![overridden(user.clone(), 2), global.clone()];
    let out = store.check_all(&[both.clone(), both.clone(), both]).await;
    let allowed: Vec<bool> = out
        .iter()
        .map(|o| o.as_ref().unwrap().1[0].allowed)
        .collect();
    assert_eq!(allowed, [true, true, false], "the override's 2 decide");
    // Without the override (it ended): 100 less the 2 admitted.
    let (_, after) = store.check(&vec![user, global]).await.unwrap();
    assert_eq!((after[0].remaining, after[1].remaining), (97, 997));
}

#[tokio::test]
async fn a_check_under_an_override_denied_on_another_node_gives_its_tokens_back() {
    let (_cluster, store) = three_nodes().await;
    let (user, ip) = (
        hourly("rl:per-user:{b}alice", 100),
        hourly("rl:per-ip:{c}10.0.0.1", 1),
    );
    assert_ne!(node_of(&user.key), node_of(&ip.key));
    let both: Check = vec![overridden(user.clone(), 5), ip];
    assert!(store
        .check(&both)
        .await
        .unwrap()
        .1
        .iter()
        .all(|r| r.allowed));
    // Taken on both nodes at once: the IP denies, the user's buckets get theirs back.
    let second = store.check(&both).await.unwrap();
    assert_eq!((second.1[0].allowed, second.1[1].allowed), (true, false));
    let (_, out) = store
        .check(&vec![overridden(user.clone(), 5)])
        .await
        .unwrap();
    assert_eq!(out[0].remaining, 3, "5 less the two admitted checks");
    assert_eq!(store.check(&vec![user]).await.unwrap().1[0].remaining, 97);
}

/// Request `id`'s slot in the set `key` of `max` slots (an in-flight rule's).
fn slot_of(key: &str, max: u64, id: &str) -> RuleSpec {
    RuleSpec {
        slot: Some(ratelimit_protocol::slot::Slot {
            ttl_ms: 30_000,
            id: id.into(),
        }),
        ..RuleSpec::plain(key, max, max, 30_000, 1)
    }
}

#[tokio::test]
async fn a_slot_taken_on_one_node_is_given_back_when_another_node_denies_its_check() {
    let (cluster, store) = three_nodes().await;
    let ip = hourly("rl:per-ip:{c}10.0.0.1", 1);
    let set = "rl:streams:{b}alice";
    assert_ne!(node_of(set), node_of(&ip.key));
    let first = store
        .check(&vec![slot_of(set, 2, "r1"), ip.clone()])
        .await
        .unwrap();
    assert!(first.1.iter().all(|r| r.allowed));
    // The IP's bucket is empty: the slot the second check took in parallel goes back.
    let second = store.check(&vec![slot_of(set, 2, "r2"), ip]).await.unwrap();
    assert_eq!((second.1[0].allowed, second.1[1].allowed), (true, false));
    let held: Vec<String> = cluster.cmd(node_of(set), redis::cmd("ZRANGE").arg(set).arg(0).arg(-1));
    assert_eq!(held, ["r1"]);
}

#[tokio::test]
async fn a_set_shared_by_every_client_is_taken_only_once_the_clients_own_rules_admit() {
    let (cluster, store) = three_nodes().await;
    // The route's slots (no client in its key) and a client's own bucket, on two nodes.
    let (route, user) = ("rl:route{b}", hourly("rl:per-user:{c}alice", 1));
    assert_ne!(node_of(route), node_of(&user.key));
    assert!(
        store
            .check(&vec![slot_of(route, 5, "r1"), user.clone()])
            .await
            .unwrap()
            .1[1]
            .allowed
    );
    let over = store
        .check(&vec![slot_of(route, 5, "r2"), user])
        .await
        .unwrap();
    assert!(!over.1[1].allowed, "alice is over her own limit");
    let held: Vec<String> = cluster.cmd(
        node_of(route),
        redis::cmd("ZRANGE").arg(route).arg(0).arg(-1),
    );
    assert_eq!(
        held,
        ["r1"],
        "her denied check never held one of everyone's slots"
    );
}
