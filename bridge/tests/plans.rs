//! Clients' plans on a real Valkey, through the bridge's own door for the gateways' lines
//! (`doors::wire::answer`): a client's plan replaces the limit its gateway sent and the
//! reply says its size, an override still beats it, a cleared plan gives the rule's limit
//! back, a bridge follows the change log (a bulk import read incrementally, a gap read in
//! full), and the metrics count checks per plan name.

use crate::common::buckets::store;
use crate::common::{Connect, Valkey};
use ratelimit_bridge::doors::wire;
use ratelimit_bridge::engine::overrides::{self, Target};
use ratelimit_bridge::engine::plans::registry::{self, Follower};
use ratelimit_bridge::engine::plans::Plan;
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::ops::labels::Transport;
use ratelimit_bridge::store::Store;
use ratelimit_config::limit::Limit;

fn target(user: &str) -> Target {
    Target::new("rl", "chat", &[user.to_string()]).unwrap()
}

fn pro(user: &str, requests: u64) -> Plan {
    Plan::new(target(user), "pro", requests, "1h", None).unwrap()
}

/// Sends `line` through the gateways' door; the reply line.
async fn send(engine: &Engine, line: &str) -> String {
    let mut out = String::new();
    wire::answer(
        engine,
        Transport::Http,
        format!("{line}\n").as_bytes(),
        &mut out,
    )
    .await
    .unwrap();
    out.trim_end().to_string()
}

/// The rule as a gateway sends it for `user`: 10 an hour.
fn check(user: &str) -> String {
    format!("rl:chat:{user},10,1,360000,1")
}

/// How many of `n` checks for `user` the bridge admits, and the last reply.
async fn admitted(engine: &Engine, user: &str, n: usize) -> (usize, String) {
    let mut allowed = 0;
    let mut last = String::new();
    for _ in 0..n {
        last = send(engine, &check(user)).await;
        allowed += usize::from(last.split(' ').nth(1).unwrap().starts_with('1'));
    }
    (allowed, last)
}

async fn follow(engine: &Engine, follower: &mut Follower) {
    follower
        .follow(engine.store(), engine.plans())
        .await
        .unwrap();
}

fn command_calls(valkey: &Valkey, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut valkey.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn a_clients_plan_is_its_limit_until_cleared_and_an_override_beats_it() {
    let valkey = Valkey::start();
    let store: Store = store(&valkey);
    let engine = Engine::new(store.clone(), None);
    let mut follower = Follower::default();
    registry::set(&store, &[pro("alice", 25)]).await.unwrap();
    follow(&engine, &mut follower).await;
    let (allowed, last) = admitted(&engine, "alice", 30).await;
    assert_eq!(allowed, 25, "the plan's 25, not the rule's 10");
    assert!(
        last.ends_with("/25"),
        "the reply says the size in force: {last}"
    );
    let (allowed, last) = admitted(&engine, "bob", 12).await;
    assert_eq!(allowed, 10);
    assert!(!last.contains('/'), "{last}");
    let metrics = store.metrics().render().unwrap();
    for series in [
        "ratelimit_bridge_plan_checks_total{plan=\"pro\",outcome=\"allowed\"} 25",
        "ratelimit_bridge_plan_checks_total{plan=\"pro\",outcome=\"denied\"} 5",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    // An emergency override beats the plan.
    let three = Limit::new(3, 3_600_000, None, 1).unwrap();
    overrides::registry::set(&store, target("carol"), three, 60_000)
        .await
        .unwrap();
    registry::set(&store, &[pro("carol", 100)]).await.unwrap();
    follow(&engine, &mut follower).await;
    engine.overrides().replace(overrides::table::Table::new(
        overrides::registry::list(&store, "rl").await.unwrap(),
    ));
    let (allowed, last) = admitted(&engine, "carol", 5).await;
    assert_eq!(allowed, 3);
    assert!(last.ends_with("/3"), "{last}");
    // Cleared, alice is back on the rule's 10 (spent already).
    assert_eq!(
        registry::clear(&store, &[target("alice")]).await.unwrap(),
        1
    );
    follow(&engine, &mut follower).await;
    let last = send(&engine, &check("alice")).await;
    assert!(
        !last.contains('/') && last.split(' ').nth(1).unwrap().starts_with('0'),
        "{last}"
    );
}

#[tokio::test]
async fn a_bridge_follows_the_log_and_reads_everything_again_past_a_gap() {
    let valkey = Valkey::start();
    let store: Store = store(&valkey);
    let engine = Engine::new(store.clone(), None);
    let mut follower = Follower::default();
    follow(&engine, &mut follower).await;
    assert_eq!(
        command_calls(&valkey, "hscan"),
        1,
        "the first read is whole"
    );
    // A bulk import: three calls, three log entries, read incrementally.
    let many: Vec<Plan> = (0..2_500).map(|i| pro(&format!("u{i}"), 20)).collect();
    assert_eq!(registry::set(&store, &many).await.unwrap(), 2_500);
    follow(&engine, &mut follower).await;
    assert_eq!(engine.plans().len(), 2_500);
    assert_eq!(
        command_calls(&valkey, "hscan"),
        1,
        "no whole read for a change"
    );
    let (allowed, _) = admitted(&engine, "u2499", 12).await;
    assert_eq!(allowed, 12);
    // Changes the bridge missed, and a log trimmed past them: it reads the plans again.
    registry::clear(&store, &[target("u0")]).await.unwrap();
    registry::set(&store, &[pro("u1", 11)]).await.unwrap();
    let _: u64 = redis::cmd("XTRIM")
        .arg("rl:{plans}:log")
        .arg("MAXLEN")
        .arg(1)
        .query(&mut valkey.connection())
        .unwrap();
    follow(&engine, &mut follower).await;
    assert!(command_calls(&valkey, "hscan") >= 2, "read whole again");
    assert_eq!(engine.plans().len(), 2_499);
    assert!(engine.plans().find("rl:chat:u0").is_none());
    assert_eq!(engine.plans().find("rl:chat:u1").unwrap().limit.burst, 11);
}

#[tokio::test]
async fn a_redis_that_lost_its_plans_is_read_whole_again() {
    let valkey = Valkey::start();
    let store: Store = store(&valkey);
    let engine = Engine::new(store.clone(), None);
    let mut follower = Follower::default();
    registry::set(&store, &[pro("alice", 25), pro("bob", 25)])
        .await
        .unwrap();
    follow(&engine, &mut follower).await;
    registry::set(&store, &[pro("carol", 25)]).await.unwrap();
    follow(&engine, &mut follower).await;
    assert_eq!(engine.plans().len(), 3);
    // Redis restarted empty, and a billing system wrote one plan since: change 1 again.
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut valkey.connection())
        .unwrap();
    registry::set(&store, &[pro("dave", 25)]).await.unwrap();
    follow(&engine, &mut follower).await;
    assert_eq!(engine.plans().len(), 1, "the lost plans are dropped");
    assert!(engine.plans().find("rl:chat:dave").is_some());
}

#[tokio::test]
async fn usage_reads_a_client_under_its_plan() {
    let valkey = Valkey::start();
    let store: Store = store(&valkey);
    let engine = Engine::new(store.clone(), None);
    registry::set(&store, &[pro("erin", 25)]).await.unwrap();
    let spec = ratelimit_protocol::RuleSpec::plain("rl:chat:erin", 10, 1, 360_000, 0);
    let usage = ratelimit_bridge::doors::usage::read(&engine, "rl", "chat", spec)
        .await
        .unwrap();
    assert_eq!(
        (usage["limit"].as_u64(), usage["remaining"].as_u64()),
        (Some(25), Some(25))
    );
    assert_eq!(usage["plan"]["plan"], "pro", "{usage}");
}
