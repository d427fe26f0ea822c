//! TLS and passwords on a three-primary Valkey Cluster. The client is given one seed and
//! discovers the other nodes from the cluster: these tests hold the discovered nodes to the
//! same TLS trust and credentials as the seed (a check on every node's slots succeeds, each
//! node's proxy saw TLS handshakes), and failures to the same rules as a single server.

use crate::common::buckets::rule;
use crate::common::cluster::{Cluster, RANGES};
use crate::common::process::BridgeProcess;
use crate::common::BRIDGE_ACL;
use ratelimit_bridge::store::connection::connect::RedisAccess;
use ratelimit_bridge::store::connection::redis_tls::TlsFiles;
use ratelimit_bridge::store::slot::slot;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;
use test_support::pki::{Ca, Scratch};

const PASSWORD: &str = "cluster-pw";

fn store(access: &RedisAccess, seed: &str) -> Store {
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(5),
    };
    Store::with_cluster(access.cluster(&[seed.to_string()]).unwrap(), options).unwrap()
}

/// One `rl:` key in each primary's slots, of a kind a gateway makes (the bridge refuses
/// any other, such as a hash tag).
fn key_per_node() -> Vec<String> {
    RANGES
        .iter()
        .map(|(first, last)| {
            (0..)
                .map(|n| format!("rl:node:{n}"))
                .find(|key| (*first..=*last).contains(&slot(key.as_bytes())))
                .unwrap()
        })
        .collect()
}

/// Checks one rule on each node's key, all in one check: whether each was admitted.
async fn check_every_node(store: &Store) -> Result<Vec<bool>, String> {
    let check = key_per_node()
        .iter()
        .map(|key| rule(key, 5, 1, 3_600_000, 1))
        .collect();
    let (_, rules) = store.check(&check).await?;
    Ok(rules.iter().map(|r| r.allowed).collect())
}

/// Whether node `i` holds `key` (asked directly, so the check really landed there).
fn holds(cluster: &Cluster, i: usize, key: &str) -> bool {
    let value: Option<Vec<u8>> = cluster.cmd(i, redis::cmd("GET").arg(key));
    value.is_some()
}

#[tokio::test]
async fn every_node_of_a_cluster_is_reached_through_tls() {
    let ca = Ca::new("cluster CA");
    let cluster = Cluster::start(None, Some(&ca.server(&["127.0.0.1"])));
    let files = Scratch::new();
    let trusting = RedisAccess {
        tls: TlsFiles {
            ca_file: Some(files.write("ca.pem", ca.pem())),
            ..TlsFiles::default()
        },
        ..RedisAccess::default()
    };
    let trusted = store(&trusting, &cluster.seed());
    assert_eq!(check_every_node(&trusted).await, Ok(vec![true; 3]));
    for (i, key) in key_per_node().iter().enumerate() {
        assert!(holds(&cluster, i, key), "node {i} holds {key}");
        assert!(
            cluster.proxies[i].handshakes() >= 1,
            "node {i} reached via TLS"
        );
    }

    let handshakes: Vec<usize> = cluster.proxies.iter().map(|p| p.handshakes()).collect();
    let untrusting = store(&RedisAccess::default(), &cluster.seed());
    let err = check_every_node(&untrusting).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    let after: Vec<usize> = cluster.proxies.iter().map(|p| p.handshakes()).collect();
    assert_eq!(after, handshakes, "no TLS session without trust");
}

#[tokio::test]
async fn discovered_cluster_nodes_get_the_seeds_credentials() {
    let cluster = Cluster::start(Some(PASSWORD), None);
    let port = cluster.announced_port(0);
    let url_password = store(
        &RedisAccess::default(),
        &format!("redis://:{PASSWORD}@127.0.0.1:{port}"),
    );
    assert_eq!(check_every_node(&url_password).await, Ok(vec![true; 3]));

    // An ACL user on every node (ACLs are per node), with what a cluster client needs on top
    // of the single-server list: the topology.
    for i in 0..RANGES.len() {
        let _: () = cluster.cmd(
            i,
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("ratelimit")
                .arg(BRIDGE_ACL)
                .arg(&[">rl-pw", "+cluster|slots"]),
        );
    }
    let files = Scratch::new();
    let flags = RedisAccess {
        username: Some("ratelimit".into()),
        password_file: Some(files.write("password", "rl-pw\n")),
        ..RedisAccess::default()
    };
    let acl_user = store(&flags, &cluster.seed());
    assert_eq!(check_every_node(&acl_user).await, Ok(vec![true; 3]));
    for (i, key) in key_per_node().iter().enumerate() {
        assert!(holds(&cluster, i, key), "node {i} holds {key}");
    }

    let wrong = RedisAccess {
        password_file: Some(files.write("wrong", "not-the-password")),
        ..RedisAccess::default()
    };
    let err = check_every_node(&store(&wrong, &cluster.seed()))
        .await
        .unwrap_err();
    assert!(err.contains("uthentication"), "{err}");
    assert!(!err.contains("not-the-password"), "{err}");
}

#[test]
fn the_binary_checks_a_cluster_through_tls_with_a_password_file() {
    let ca = Ca::new("cluster CA");
    let cluster = Cluster::start(Some(PASSWORD), Some(&ca.server(&["127.0.0.1"])));
    let files = Scratch::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let password_file = files.write("password", PASSWORD);
    let bridge = BridgeProcess::start(&[
        "--cluster",
        "--redis",
        &cluster.seed(),
        "--redis-ca-file",
        ca_file.to_str().unwrap(),
        "--redis-password-file",
        password_file.to_str().unwrap(),
    ]);
    let body: String = key_per_node()
        .iter()
        .map(|key| format!("{key},5,1,3600000,1\n"))
        .collect();
    let (status, answer) = bridge.check(&body);
    assert_eq!(status, 200);
    for line in answer.lines() {
        assert!(
            line.split(' ')
                .nth(1)
                .is_some_and(|r| r.starts_with("1,4,")),
            "{answer}"
        );
    }
    assert_eq!(answer.lines().count(), 3, "{answer}");
    assert_eq!(bridge.health(), 200);
    for (i, proxy) in cluster.proxies.iter().enumerate() {
        assert!(proxy.handshakes() >= 1, "node {i} reached via TLS");
    }
    assert!(!bridge.log().contains(PASSWORD));
}
