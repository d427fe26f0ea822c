use super::*;
use crate::fakes::FakeRequest;
use ratelimit_config::keys::{typed, MAX_VALUE_LEN};
use std::borrow::Cow;

/// An identity that must resolve (no repeated header in these requests).
pub(super) fn resolve(source: &Source, req: &FakeRequest) -> Option<String> {
    super::resolve(source, req).unwrap().map(Cow::into_owned)
}

pub(super) fn header(name: &str) -> Source {
    Source::Header(name.into())
}

fn peer() -> Source {
    Source::Address(Address {
        forwarded: None,
        ipv6_prefix: 128,
    })
}

fn xff(hops: u32, gateway_appends: bool) -> Source {
    Source::Address(Address {
        forwarded: Some(Forwarded {
            hops,
            gateway_appends,
        }),
        ipv6_prefix: 128,
    })
}

#[test]
fn header_values_are_trimmed_and_empty_means_missing() {
    let src = header("x-user-id");
    assert_eq!(
        resolve(&src, &FakeRequest::default().with("x-user-id", " alice ")).as_deref(),
        Some("alice")
    );
    assert_eq!(
        resolve(&src, &FakeRequest::default().with("x-user-id", "   ")),
        None
    );
    assert_eq!(resolve(&src, &FakeRequest::default()), None);
}

#[test]
fn hostile_header_values_cannot_forge_keys_or_hash_tags() {
    let src = header("x-user-id");
    let value = resolve(
        &src,
        &FakeRequest::default().with("x-user-id", "a:b{c}d,e f\n%"),
    )
    .unwrap();
    assert_eq!(value, "a%3Ab%7Bc%7Dd%2Ce%20f%0A%25");
    let binary = resolve(
        &src,
        &FakeRequest::default().with("x-user-id", b"\xff\x00ok"),
    )
    .unwrap();
    assert_eq!(binary, "%FF%00ok");
}

#[test]
fn oversized_values_become_a_bounded_digest() {
    let src = header("x-api-key");
    let long = "k".repeat(100_000);
    let a = resolve(&src, &FakeRequest::default().with("x-api-key", &long)).unwrap();
    assert!(a.starts_with('#') && a.len() == 65, "{a}");
    let b = resolve(
        &src,
        &FakeRequest::default().with("x-api-key", format!("{long}x")),
    )
    .unwrap();
    assert_ne!(a, b, "different keys keep different buckets");
    let exact = "k".repeat(MAX_VALUE_LEN);
    assert_eq!(escape(exact.as_bytes()), exact);
}

#[test]
fn peer_address_drops_the_port() {
    let req = FakeRequest::default().peer_at("203.0.113.7:51234");
    assert_eq!(resolve(&peer(), &req).as_deref(), Some("203.0.113.7"));
    let req = FakeRequest::default().peer_at("[2001:db8::1]:443");
    assert_eq!(resolve(&peer(), &req).as_deref(), Some("2001%3Adb8%3A%3A1"));
    assert_eq!(
        resolve(&peer(), &FakeRequest::default().peer_at("garbage")),
        None
    );
    assert_eq!(resolve(&peer(), &FakeRequest::default()), None);
}

#[test]
fn forwarded_for_trusts_only_the_configured_hops_from_the_right() {
    let xff = |hops| xff(hops, false);
    let req = FakeRequest::default()
        .peer_at("10.0.0.2:1000")
        .with("x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.0.0.1");
    assert_eq!(resolve(&xff(1), &req).as_deref(), Some("10.0.0.1"));
    assert_eq!(resolve(&xff(2), &req).as_deref(), Some("198.51.100.9"));
    // Fewer entries than trusted hops: the header did not come through our proxies.
    assert_eq!(resolve(&xff(4), &req).as_deref(), Some("10.0.0.2"));
}

#[test]
fn the_entry_the_gateway_appended_is_not_a_hop() {
    let xff = |hops| xff(hops, true);
    // Envoy (use_remote_address) appended the balancer it sees as peer...
    let behind_balancer = FakeRequest::default()
        .peer_at("10.0.0.2:1000")
        .with("x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.0.0.2");
    assert_eq!(
        resolve(&xff(1), &behind_balancer).as_deref(),
        Some("198.51.100.9")
    );
    assert_eq!(
        resolve(&xff(2), &behind_balancer).as_deref(),
        Some("6.6.6.6")
    );
    // ...or its own address, when the peer is loopback.
    let local = FakeRequest::default()
        .peer_at("127.0.0.1:1000")
        .with("x-forwarded-for", "198.51.100.9,192.0.2.2");
    assert_eq!(resolve(&xff(1), &local).as_deref(), Some("198.51.100.9"));
    // Only Envoy's own entry: no proxy in front, the peer is the client.
    let direct = FakeRequest::default()
        .peer_at("203.0.113.5:1000")
        .with("x-forwarded-for", "203.0.113.5");
    assert_eq!(resolve(&xff(1), &direct).as_deref(), Some("203.0.113.5"));
}

#[test]
fn spoofed_or_garbage_forwarded_for_falls_back_to_the_peer() {
    for gateway_appends in [false, true] {
        let src = xff(1, gateway_appends);
        for bad in ["", "not-an-ip", "1.2.3.4, ", "999.1.1.1", "1.2.3.4,evil,x"] {
            // What the gateway appended (the peer) after the proxies' entries.
            let xff = if gateway_appends {
                format!("{bad},192.0.2.1")
            } else {
                bad.to_string()
            };
            let req = FakeRequest::default()
                .peer_at("192.0.2.1:80")
                .with("x-forwarded-for", xff);
            assert_eq!(
                resolve(&src, &req).as_deref(),
                Some("192.0.2.1"),
                "{bad:?} {gateway_appends}"
            );
        }
        let req = FakeRequest::default().peer_at("192.0.2.1:80");
        assert_eq!(resolve(&src, &req).as_deref(), Some("192.0.2.1"));
    }
}

#[test]
fn forwarded_for_reads_the_same_whether_its_copies_come_apart_or_joined() {
    // A balancer that adds its own copy rather than appending to the client's: read as
    // the one list Envoy makes of them ("6.6.6.6, 10.9.9.9,198.51.100.9,192.0.2.2").
    let apart = FakeRequest::default()
        .peer_at("127.0.0.1:1000")
        .with("x-forwarded-for", "6.6.6.6, 10.9.9.9")
        .also("x-forwarded-for", "198.51.100.9")
        .also("x-forwarded-for", "192.0.2.2");
    let joined = FakeRequest::default().peer_at("127.0.0.1:1000").with(
        "x-forwarded-for",
        "6.6.6.6, 10.9.9.9,198.51.100.9,192.0.2.2",
    );
    for hops in 1..=4 {
        let src = xff(hops, true);
        assert_eq!(resolve(&src, &apart), resolve(&src, &joined), "{hops} hops");
    }
    assert_eq!(
        resolve(&xff(1, true), &apart).as_deref(),
        Some("198.51.100.9")
    );
    assert_eq!(
        resolve(&xff(2, false), &apart).as_deref(),
        Some("198.51.100.9")
    );
    assert_eq!(resolve(&xff(3, true), &apart).as_deref(), Some("6.6.6.6"));
}

#[test]
fn ipv6_clients_are_keyed_on_their_prefix_and_mapped_ipv4_as_ipv4() {
    let on = |prefix| {
        Source::Address(Address {
            forwarded: None,
            ipv6_prefix: prefix,
        })
    };
    let at = |peer: &str| FakeRequest::default().peer_at(peer);
    let key = |prefix, peer: &str| resolve(&on(prefix), &at(peer));
    // Rotating the interface identifier inside one /64 keeps the bucket.
    let a = key(64, "[2001:db8:1:2:aaaa::1]:443");
    assert_eq!(a.as_deref(), Some("2001%3Adb8%3A1%3A2%3A%3A%2F64"));
    assert_eq!(key(64, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1"), a);
    assert_ne!(key(64, "[2001:db8:1:3::1]:1"), a);
    assert_eq!(
        key(48, "[2001:db8:1:ffff::9]:1").as_deref(),
        Some("2001%3Adb8%3A1%3A%3A%2F48")
    );
    assert_eq!(
        key(128, "[2001:db8::9]:1").as_deref(),
        Some("2001%3Adb8%3A%3A9")
    );
    // An IPv4 client seen through a dual-stack socket is its own IPv4 address, not a
    // share of ::ffff:0:0/64 with every other IPv4 client.
    assert_eq!(
        key(64, "[::ffff:198.51.100.7]:80").as_deref(),
        Some("198.51.100.7")
    );
    assert_eq!(key(64, "198.51.100.7:80").as_deref(), Some("198.51.100.7"));
    // The same through X-Forwarded-For.
    let xff64 = Source::Address(Address {
        forwarded: Some(Forwarded {
            hops: 1,
            gateway_appends: false,
        }),
        ipv6_prefix: 64,
    });
    let req = at("10.0.0.1:1").with("x-forwarded-for", "2001:db8:1:2::77");
    assert_eq!(resolve(&xff64, &req), a);
}

#[test]
fn a_typed_value_is_escaped_as_the_same_header_value_would_be() {
    let req = FakeRequest::default().with("x-user-id", " a b/{c} ");
    assert_eq!(typed(" a b/{c} "), resolve(&header("x-user-id"), &req));
    assert_eq!(typed("alice").as_deref(), Some("alice"));
    assert_eq!(typed("  "), None);
}
