//! The bridge serves only keys the filter can produce (`ratelimit_protocol::key`): a
//! caller naming anything else under a prefix (the overrides' namespace, a forged record, a
//! value the filter would have escaped) gets its check refused alone (`?`), and Redis is
//! left as it was.

use crate::common::buckets::store;
use crate::common::client::{http1, req};
use crate::common::server::start;
use crate::common::{Connect, Valkey};
use hyper::{Method, StatusCode};
use ratelimit_bridge::engine::overrides::registry;
use ratelimit_bridge::engine::overrides::{parse_spec, Target};

/// The reply line to a check of `key` alone through the bridge's HTTP transport.
async fn check_line(addr: std::net::SocketAddr, key: &str) -> String {
    let body = format!("{key},5,1,1000,1\n");
    let (status, reply) = http1(addr, req(Method::POST, "/v1/check", &body)).await;
    assert_eq!(status, StatusCode::OK, "{key}: {reply}");
    reply.trim_end().to_string()
}

fn dbsize(valkey: &Valkey) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut valkey.connection())
        .unwrap()
}

#[tokio::test]
async fn the_overrides_namespace_cannot_be_named_in_a_check() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    // The index, a record, and a record of a per-client override: all refused untouched.
    for key in [
        "rl:{overrides}",
        "rl:{overrides}:per-user",
        "rl:{overrides}:per-user:bob",
    ] {
        let line = check_line(bridge.addr, key).await;
        assert!(
            line.starts_with("? ") && line.contains(key),
            "{key}: {line}"
        );
    }
    assert_eq!(dbsize(&valkey), 0, "nothing was written");
    // So the operators' overrides still work: set, then listed.
    let store = store(&valkey);
    let (limit, ttl) = parse_spec(1000, "1m", None, "1h").unwrap();
    let bob = Target::new("rl", "per-user", &["bob".into()]).unwrap();
    registry::set(&store, bob.clone(), limit, ttl)
        .await
        .unwrap();
    let listed = registry::list(&store, "rl").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].target, bob);
    // Naming them once they exist changes nothing either.
    for key in ["rl:{overrides}", "rl:{overrides}:per-user:bob"] {
        assert!(
            check_line(bridge.addr, key).await.starts_with("? "),
            "{key}"
        );
    }
    assert_eq!(registry::list(&store, "rl").await.unwrap().len(), 1);
}

#[tokio::test]
async fn only_keys_in_the_filters_alphabet_are_checked() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let digest = "0123456789abcdef".repeat(4);
    let produced = [
        "rl:global".to_string(),
        "rl:per-user:alice".into(),
        "rl:per-user:a%3Ab%7Bc%7D%FF".into(),
        "rl:per-ip:2001%3Adb8%3A1%3A2%3A%3A%2F64".into(),
        "rl:four:aZ09._@+=!~-:x:y:z".into(),
        format!("rl:per-user:#{digest}"),
        format!("rl:two:#{digest}:bob"),
        format!("rl:per-user:{}", "v".repeat(128)),
        format!("rl:{}", "r".repeat(64)),
    ];
    for key in &produced {
        let line = check_line(bridge.addr, key).await;
        assert!(line.contains(" 1,4,"), "{key}: {line}");
    }
    let never = [
        "rl:".to_string(),
        "rl:r:".into(),
        "rl:r::x".into(),
        "rl:r:x:".into(),
        "rl:{t}:x".into(),
        "rl:r:{user}".into(),
        "rl:r:a/b".into(),
        "rl:r:100%".into(),
        "rl:r:%zz".into(),
        "rl:r:%3a".into(), // the filter writes upper-case hex
        "rl:r:%41".into(), // 'A' is written as it is, never escaped
        "rl:r:#".into(),
        format!("rl:r:#{}", &digest[1..]),
        format!("rl:r:#{}", digest.to_uppercase()),
        format!("rl:r:#{digest}0"),
        format!("rl:r:x#{digest}"),
        format!("rl:r:{}", "v".repeat(129)),
        format!("rl:{}", "r".repeat(65)),
        format!("rl:{}:x", "r".repeat(65)),
    ];
    for key in &never {
        let line = check_line(bridge.addr, key).await;
        assert!(line.starts_with("? "), "{key}: {line}");
    }
    assert_eq!(dbsize(&valkey), produced.len() as u64, "only the produced");
}
