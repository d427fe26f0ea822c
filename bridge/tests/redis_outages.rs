//! Redis going away and coming back: the bridge is ready again by the time a check comes,
//! and a script call that may have run (its answer lost with the connection) is never sent
//! a second time, on one server or a cluster, as that would take its tokens twice.

use crate::common::buckets::{options, reset_stats, rule, script_calls, stored};
use crate::common::client::{http1, req};
use crate::common::cluster::OneNodeCluster;
use crate::common::cutter::Cutter;
use crate::common::server::start;
use crate::common::{Connect, Valkey};
use hyper::{Method, StatusCode};
use ratelimit_bridge::store::Store;
use std::time::Duration;

#[tokio::test]
async fn the_first_check_after_redis_restarts_succeeds() {
    let mut valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let check = || req(Method::POST, "/v1/check", "rl:k,5,1,1000,1\n");
    let (status, reply) = http1(bridge.addr, check()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.contains(" 1,4,"), "{reply}");
    valkey.stop();
    // Checks meanwhile fail (line by line), and leave the connection broken.
    for _ in 0..3 {
        let (_, reply) = http1(bridge.addr, check()).await;
        assert!(reply.starts_with("! "), "{reply}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    valkey.restart();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, reply) = http1(bridge.addr, check()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        reply.contains(" 1,4,"),
        "the first check after the restart: {reply}"
    );
}

/// Loses the answer to one check's script call through `cutter`, and checks that `server`
/// ran it once: one script call, one token of 10 taken. The next check is served at once.
async fn lose_one_answer(store: &Store, cutter: &Cutter, server: &impl Connect) {
    let check = vec![rule("{k}lost", 10, 1, 3_600_000, 1)];
    // Loads the script, so that the lost call is a single EVALSHA.
    store
        .check(&vec![rule("{k}warm", 1, 1, 1, 1)])
        .await
        .unwrap();
    reset_stats(server);
    cutter.arm();
    let lost = store.check(&check).await;
    assert!(lost.is_err(), "the answer was lost, yet: {lost:?}");
    assert_eq!(script_calls(server), 1);
    let tokens = stored(server, "{k}lost").unwrap().units / 3_600_000;
    assert_eq!(tokens, 9, "tokens left after the lost call");
    let (_, next) = store.check(&check).await.unwrap();
    assert_eq!(next[0].remaining, 8);
}

#[tokio::test]
async fn a_script_call_whose_answer_is_lost_is_not_sent_again_to_one_server() {
    let valkey = Valkey::start();
    let cutter = Cutter::start(valkey.addr()).await;
    let store = Store::new(&format!("redis://{}", cutter.addr), options()).unwrap();
    lose_one_answer(&store, &cutter, &valkey).await;
}

#[tokio::test]
async fn a_script_call_whose_answer_is_lost_is_not_sent_again_to_a_cluster() {
    let node = OneNodeCluster::start();
    let cutter = Cutter::start(([127, 0, 0, 1], node.port).into()).await;
    // The node tells clients to reach it through the proxy.
    let _: () = node.cmd(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-announce-port")
            .arg(cutter.addr.port()),
    );
    let store = Store::cluster(&[format!("redis://{}", cutter.addr)], options()).unwrap();
    lose_one_answer(&store, &cutter, &node).await;
}
