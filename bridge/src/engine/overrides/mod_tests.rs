use super::records::{decode, encode, index_key, record_key};
use super::table::{overridden, Table};
use super::*;
use crate::store::check::RuleSpec;

fn rule(key: &str) -> RuleSpec {
    RuleSpec::plain(key, 3, 1, 20_000, 1)
}

fn active(prefix: &str, rule: &str, values: &[&str], requests: u64) -> Override {
    let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    Override {
        target: Target::new(prefix, rule, &values).unwrap(),
        limit: Limit::new(requests, 60_000, None, 1).unwrap(),
        expires_ms: 1,
    }
}

#[test]
fn records_never_share_a_name_with_a_bucket() {
    assert_eq!(index_key("rl"), "rl:{overrides}");
    assert_eq!(
        record_key("rl", "per-user:alice"),
        "rl:{overrides}:per-user:alice"
    );
    // Whatever the client sends, its value is escaped: no bucket holds a brace.
    let hostile = Target::new("rl", "r", &["{overrides}".into()]).unwrap();
    assert_eq!(hostile.key, "rl:r:%7Boverrides%7D");
    // And no key of the namespace is one a check may name (`keyspace`).
    for key in [
        index_key("rl"),
        record_key("rl", "r"),
        record_key("rl", "r:bob"),
    ] {
        assert!(ratelimit_protocol::key::parse_key(&key).is_err(), "{key}");
    }
    assert!(Target::new("rl", "{overrides}", &[]).is_err());
    assert!(Target::new("r:l", "r", &[]).is_err());
    assert!(Target::new("rl", "r", &[" ".into()]).is_err());
}

#[test]
fn targets_are_typed_values_escaped_as_gateways_do() {
    let t = Target::new("rl", "per-user", &[" al ice ".into()]).unwrap();
    assert_eq!(
        (t.key.as_str(), t.member()),
        ("rl:per-user:al%20ice", "per-user:al%20ice")
    );
    assert!(!t.rule_wide());
    let all = Target::new("rl", "per-user", &[]).unwrap();
    assert_eq!((all.key.as_str(), all.rule_wide()), ("rl:per-user", true));
}

#[test]
fn records_round_trip_and_bad_ones_are_named() {
    let (limit, ttl) = parse_spec(10, "1m", Some(20), "30s").unwrap();
    assert_eq!(
        (limit.burst, limit.num, limit.den, ttl),
        (20, 1, 6000, 30_000)
    );
    let read = decode("rl", "per-user:alice", &format!("{} 99", encode(&limit))).unwrap();
    assert_eq!((read.limit, read.expires_ms), (limit, 99));
    assert_eq!(
        read.target,
        Target::new("rl", "per-user", &["alice".into()]).unwrap()
    );
    for bad in [
        "",
        "10 60000 20",
        "10 60000 20 x",
        "0 60000 1 5",
        "1 2 3 4 5",
    ] {
        let e = decode("rl", "r", bad).unwrap_err();
        assert!(e.contains("rl:{overrides}:r"), "{e}");
    }
    assert!(parse_spec(0, "1m", None, "1m")
        .unwrap_err()
        .starts_with("requests"));
    assert!(parse_spec(1, "soon", None, "1m")
        .unwrap_err()
        .starts_with("per"));
    assert!(parse_spec(1, "1m", None, "0s")
        .unwrap_err()
        .starts_with("ttl"));
    assert!(parse_spec(1, "1m", Some(0), "1m")
        .unwrap_err()
        .starts_with("burst"));
}

#[test]
fn a_ttl_is_one_ms_to_a_year() {
    let ttl = |text: &str| parse_spec(1, "1m", None, text).map(|(_, ms)| ms);
    assert_eq!(ttl("1ms"), Ok(1));
    assert_eq!(ttl("365d"), Ok(MAX_TTL_MS));
    assert_eq!(ttl("8760h"), Ok(MAX_TTL_MS));
    for beyond in [
        "366d",
        "31536000001ms",
        "3650000d",
        "18446744073709551615ms",
    ] {
        let e = ttl(beyond).unwrap_err();
        assert!(
            e.starts_with("ttl: ") && e.contains("365d"),
            "{beyond}: {e}"
        );
    }
    for bad in ["0s", "0ms", "99999999999999999999d", "1y", "-1d", ""] {
        assert!(ttl(bad).unwrap_err().starts_with("ttl: "), "{bad}");
    }
}

#[test]
fn a_client_override_wins_over_its_rules_and_touches_no_other_rule() {
    let table = Table::new([
        active("rl", "per-user", &[], 5),
        active("rl", "per-user", &["alice"], 2),
        active("rl", "global", &[], 7),
    ]);
    let burst = |key: &str| table.find(key).map(|o| o.limit.burst);
    assert_eq!(burst("rl:per-user:alice"), Some(2));
    assert_eq!(burst("rl:per-user:bob"), Some(5));
    assert_eq!(burst("rl:global"), Some(7));
    assert_eq!(burst("rl:per-user2:alice"), None);
    assert_eq!(burst("rl:per-user"), Some(5));
    assert_eq!(burst("edge:per-user:alice"), None);
    assert_eq!(burst("rl:per-users:bob"), None);
}

/// The rate limit service's buckets: a domain, or a descriptor's leading entries; the
/// longest named wins, and nothing names them as a plugin rule.
#[test]
fn the_services_overrides_cover_a_domain_or_leading_entries() {
    let at = |member: &str, requests| Override {
        target: Target {
            prefix: "rl".into(),
            rule: SERVICE_RULE.into(),
            key: format!("rl:{member}"),
        },
        ..active("rl", "r", &[], requests)
    };
    let table = Table::new([
        at("rls:edge", 1),
        at("rls:edge:tenant:acme", 2),
        at("rls:edge:path", 3),
    ]);
    let burst = |key: &str| table.find(key).map(|o| o.limit.burst);
    assert_eq!(burst("rl:rls:edge:remote_address:1.2.3.4"), Some(1));
    assert_eq!(burst("rl:rls:edge:tenant:acme:path:x"), Some(2));
    assert_eq!(burst("rl:rls:edge:tenant:acme"), Some(2));
    assert_eq!(burst("rl:rls:edge:tenant:acme2"), Some(1));
    assert_eq!(burst("rl:rls:edge:path:x"), Some(3));
    assert_eq!(burst("rl:rls:edgy:path:x"), None, "another domain");
    assert_eq!(burst("rl:rls"), None);
    assert_eq!(burst("edge:rls:edge:path:x"), None, "another prefix");
    assert_eq!(burst("rl:edge:tenant"), None, "a plugin rule named edge");
    assert!(Target::new("rl", SERVICE_RULE, &[]).is_err());
    assert_eq!(
        table.find("rl:rls:edge:k:v").unwrap().target.scope(),
        "domain"
    );
}

#[test]
fn applying_adds_the_override_and_keeps_the_rule() {
    let table = Table::new([active("rl", "per-user", &["alice"], 10)]);
    let mut check = vec![rule("rl:per-user:alice"), rule("rl:per-user:bob")];
    table.apply(&mut check);
    let o = check[0].overridden.unwrap();
    assert_eq!((o.burst, o.num, o.den, o.until_ms), (10, 1, 6000, 1));
    assert_eq!(
        (check[0].burst, check[0].num, check[0].den, check[0].cost),
        (3, 1, 20_000, 1),
        "the rule's own limit stays: its bucket still pays"
    );
    assert_eq!(check[1], rule("rl:per-user:bob"));
    let mut costly = rule("rl:per-user:alice");
    costly.cost = 20;
    overridden(&mut costly, table.find("rl:per-user:alice").unwrap());
    assert_eq!(
        costly.overridden.unwrap().burst,
        20,
        "the bucket holds one request's cost"
    );
}
