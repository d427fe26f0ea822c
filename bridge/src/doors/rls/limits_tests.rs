use super::*;
use crate::doors::rls::raw::unit_ms;
use std::path::Path;

fn examples() -> Limits {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rls/examples");
    crate::doors::rls::source::load(&dir, false).unwrap()
}

fn find<'a>(limits: &'a Limits, domain: &str, entries: &[(&str, &str)]) -> Option<&'a Rule> {
    limits
        .find(domain, entries.iter().copied())
        .map(|r| r.as_ref())
}

fn per(rule: &Rule) -> (u32, i32) {
    (rule.requests_per_unit, rule.unit)
}

#[test]
fn the_documented_examples_load_and_find_their_limits() {
    let l = examples();
    assert_eq!(l.domains(), 10);
    // 1: exact values.
    let users = find(&l, "mongo_cps", &[("database", "users")]).unwrap();
    assert_eq!(
        (per(users), users.label.key.as_str()),
        ((500, 1), "database_users")
    );
    assert!(find(&l, "mongo_cps", &[("database", "other")]).is_none());
    assert!(find(&l, "other", &[("database", "users")]).is_none());
    // 2: nested; the limit is where the last entry lands, and a key alone takes any value.
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let rule = find(&l, "messaging", &marketing).unwrap();
    assert_eq!(
        (per(rule), rule.label.key.as_str()),
        ((5, 4), "message_type_marketing.to_number")
    );
    assert!(find(&l, "messaging", &marketing[..1]).is_none());
    assert_eq!(
        per(find(&l, "messaging", &[("to_number", "1")]).unwrap()),
        (100, 4)
    );
    // 3: an exact value wins over the key alone.
    let blocked = find(&l, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]).unwrap();
    assert_eq!(blocked.quota, Quota::Blocked);
    let other = find(&l, "edge_proxy_per_ip", &[("remote_address", "50.0.0.6")]).unwrap();
    assert!(
        matches!(other.quota, Quota::Bucket(limit) if limit.burst == 10 && limit.per_ms == 1000)
    );
    // 4: one level per entry.
    let sub = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(per(find(&l, "example4", &sub).unwrap()), (300, 1));
    assert!(find(&l, "example4", &sub[..1]).is_none());
    // 5: unlimited.
    assert_eq!(
        find(&l, "internal", &[("ldap", "x")]).unwrap().quota,
        Quota::Unlimited
    );
    assert_eq!(
        per(find(&l, "internal", &[("azure", "x")]).unwrap()),
        (100, 2)
    );
    // 6: shadow mode under a key without a value.
    let a = find(&l, "example6", &[("service", "auth"), ("user", "user-a")]).unwrap();
    let b = find(&l, "example6", &[("service", "auth"), ("user", "user-b")]).unwrap();
    assert_eq!(
        (a.shadow, per(a), b.shadow, per(b)),
        (true, (10, 1), false, (20, 1))
    );
    // 7: replaces.
    let one = find(
        &l,
        "example7",
        &[("key_1", "value_1"), ("user", "bkthomps")],
    )
    .unwrap();
    let two = find(
        &l,
        "example7",
        &[("key_2", "value_2"), ("user", "bkthomps")],
    )
    .unwrap();
    assert_eq!(
        (one.name.as_str(), two.replaces.as_slice()),
        ("specific_limit", &["specific_limit".to_string()][..])
    );
    // 8: detailed_metric changes nothing of the lookup.
    assert_eq!(
        per(find(&l, "example8", &[("key1", "any")]).unwrap()),
        (10, 2)
    );
    assert_eq!(
        per(find(&l, "example8", &[("key1", "value1")]).unwrap()),
        (20, 2)
    );
    // 9: a prefix, per value; share_threshold: one bucket for every value under it.
    let nine = find(&l, "example9", &[("key1", "value_2")]).unwrap();
    assert_eq!((per(nine), nine.shared.is_empty()), ((20, 2), true));
    assert!(find(&l, "example9", &[("key1", "other")]).is_none());
    let shared = find(&l, "shared", &[("path", "/foo/b")]).unwrap();
    assert_eq!(shared.shared, [(0, "/foo/*".to_string())]);
}

#[test]
fn units_from_second_to_year() {
    for (unit, number, ms) in [
        ("second", 1, 1_000),
        ("MINUTE", 2, 60_000),
        ("hour", 3, 3_600_000),
        ("day", 4, 86_400_000),
        ("week", 7, 604_800_000),
        ("month", 5, 2_592_000_000),
        ("year", 6, 31_536_000_000),
    ] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 1000}}\n"
        );
        let limits = Limits::parse([("f.yaml", text.as_str())], false).unwrap();
        let rule = find(&limits, "d", &[("k", "v")]).unwrap();
        assert_eq!(rule.unit, number, "{unit}");
        assert!(matches!(rule.quota, Quota::Bucket(l) if l.per_ms == ms && l.burst == 1000));
        assert_eq!(unit_ms(number), Some(ms));
    }
}

#[test]
fn what_is_not_supported_is_refused_in_one_line_naming_the_place() {
    let cases = [
        ("domain: d\nfoo: 1\n", "unknown field `foo`"),
        ("descriptors: []\n", "missing field `domain`"),
        ("domain: ''\n", "the domain is empty"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "k: unit \"fortnight\" is not second",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
            "k: rate_limit has no unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
            "k: rate_limit has no requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
            "k: an unlimited rate_limit takes no unit",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
            "k_v: the same descriptor is configured twice",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true}\n",
            "k_v: share_threshold needs a value with a '*'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967295}\n",
            "k: 4294967295 per year: too large for this period",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "invalid type: integer `-1`, expected u32",
        ),
    ];
    for (text, expected) in cases {
        let error = Limits::parse([("f.yaml", text)], false).unwrap_err();
        assert!(error.starts_with("f.yaml: "), "{error}");
        assert!(error.contains(expected), "{text:?}: {error}");
        assert!(!error.contains('\n'), "{error:?}");
    }
    let twice = Limits::parse(
        [("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")],
        false,
    );
    assert_eq!(
        twice.unwrap_err(),
        "b.yaml: domain \"d\" is configured twice (MERGE_DOMAIN_CONFIG, --rls-merge-domains, \
         merges them)"
    );
    let mut deep = String::from("domain: d\ndescriptors:\n");
    for depth in 0..=MAX_DEPTH {
        let pad = "  ".repeat(2 * depth);
        deep.push_str(&format!("{pad}  - key: k\n{pad}    descriptors:\n"));
    }
    assert!(Limits::parse([("f.yaml", deep.as_str())], false)
        .unwrap_err()
        .contains("nest deeper"));
}

#[test]
fn a_longer_descriptor_than_configured_or_none_has_no_limit() {
    let l = examples();
    assert!(find(&l, "mongo_cps", &[]).is_none());
    assert!(find(&l, "mongo_cps", &[("database", "users"), ("x", "y")]).is_none());
}
