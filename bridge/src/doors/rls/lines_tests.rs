use super::*;
use crate::doors::rls::proto::{LimitOverride, UInt64Value};
use crate::doors::rls::source;
use proptest::prelude::*;
use ratelimit_protocol::key::parse_key;
use std::path::Path;

fn examples() -> Limits {
    source::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rls/examples"),
        false,
    )
    .unwrap()
}

/// Keys, values and domains from the examples, mixed with hostile bytes.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("mongo_cps".to_string()),
        Just("messaging".to_string()),
        Just("database".to_string()),
        Just("users".to_string()),
        Just("to_number".to_string()),
        Just("key1".to_string()),
        Just(RESERVE.to_string()),
        Just(RESERVED.to_string()),
        Just(SLOT.to_string()),
        Just(RELEASE.to_string()),
        Just(String::new()),
        "[a-z0-9:{}%#* ]{0,12}",
        ".{0,300}",
    ]
}

/// An entry's key: any text, empty too (no configured key is, so it finds no limit, but
/// an override's bucket is keyed on it).
fn key() -> impl Strategy<Value = String> {
    text()
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec((key(), text()), 0..5),
        prop::option::of((any::<u32>(), -1i32..9)),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(entries, limit, hits)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            limit: limit.map(|(requests_per_unit, unit)| LimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
        })
}

proptest! {
    /// Whatever a caller sends, planning answers or refuses it, never panics, and every
    /// bucket it would touch is a key of the grammar the bridge holds gateways to, once per
    /// call, with hits the script takes.
    #[test]
    fn hostile_calls_plan_to_valid_calls_or_a_refusal(
        domain in text(),
        descriptors in prop::collection::vec(descriptor(), 0..40),
        hits_addend in any::<u32>(),
    ) {
        let limits = examples();
        let request = RateLimitRequest { domain, descriptors, hits_addend };
        let lines = match lines(&limits, &request, "rl", "rls-1") {
            Ok(lines) => lines,
            Err(Refusal::Invalid(_)) => return Ok(()),
            Err(Refusal::Failed(why)) => panic!("planning never fails as Redis does: {why}"),
        };
        prop_assert_eq!(lines.descriptors.len(), request.descriptors.len());
        for call in [&lines.check, &lines.read, &lines.cost, &lines.release] {
            prop_assert!(call.len() <= MAX_RULES);
            for (i, rule) in call.iter().enumerate() {
                prop_assert!(parse_key(&rule.key).is_ok(), "{}", rule.key);
                prop_assert!(call.iter().skip(i + 1).all(|r| r.key != rule.key));
                prop_assert!(rule.cost < MAX_EXACT && rule.burst < MAX_EXACT);
                if let Some(settle) = &rule.settle {
                    prop_assert!(settle.delta.unsigned_abs() < MAX_EXACT);
                    prop_assert!(ratelimit_protocol::valid_settlement_id(&settle.id));
                }
                if let Some(slot) = &rule.slot {
                    prop_assert!(ratelimit_protocol::valid_settlement_id(&slot.id));
                }
            }
        }
        for line in &lines.descriptors {
            let call = match line.ask {
                Ask::Check => &lines.check,
                Ask::Read => &lines.read,
                Ask::Cost => &lines.cost,
                Ask::Release => &lines.release,
                Ask::Free | Ask::Over => continue,
            };
            prop_assert!(line.at < call.len());
        }
    }
}

#[test]
fn a_reservation_and_its_commit_name_the_same_bucket_as_the_plain_descriptor() {
    let limits = examples();
    let with = |marker: Option<(&str, &str)>, hits: Option<u64>| {
        let mut entries = vec![Entry {
            key: "database".into(),
            value: "users".into(),
        }];
        if let Some((key, value)) = marker {
            entries.push(Entry {
                key: key.into(),
                value: value.into(),
            });
        }
        let request = RateLimitRequest {
            domain: "mongo_cps".into(),
            descriptors: vec![RateLimitDescriptor {
                entries,
                limit: None,
                hits_addend: hits.map(|value| UInt64Value { value }),
            }],
            hits_addend: 0,
        };
        lines(&limits, &request, "rl", "id").unwrap()
    };
    let plain = with(None, None);
    let reserve = with(Some((RESERVE, "1")), Some(7));
    let commit = with(Some((RESERVED, "7")), Some(3));
    assert_eq!(plain.check[0].key, "rl:rls:mongo_cps:database:users");
    assert_eq!(
        (reserve.check[0].key.as_str(), reserve.check[0].cost),
        (plain.check[0].key.as_str(), 7)
    );
    let settle = commit.cost[0].settle.as_ref().unwrap();
    assert_eq!(
        (commit.cost[0].key.as_str(), settle.delta),
        (plain.check[0].key.as_str(), -4)
    );
}

/// A limit with `global` is checked as the plugin's global rules are (the spec carries its
/// terms); what regions cannot do yet (a descriptor's own hits, reservations) is refused, as
/// a plugin's global rule that meters is; a caller's `limit` applies only in a configured
/// domain, as envoyproxy/ratelimit applies it.
#[test]
fn global_limits_and_callers_limits_are_planned_as_documented() {
    let yaml = "domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 20, global: {home: eu, lease_ttl: 500ms}}
";
    let limits = Limits::parse([("edge.yaml", yaml)], false).unwrap();
    let call = |domain: &str, hits: Option<u64>, limit: Option<LimitOverride>| {
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: "acme".into(),
                }],
                limit,
                hits_addend: hits.map(|value| UInt64Value { value }),
            }],
            hits_addend: 2,
        };
        lines(&limits, &request, "rl", "id")
    };
    let checked = call("edge", None, None).unwrap();
    let global = checked.check[0].global.as_ref().unwrap();
    assert_eq!(
        (global.home.as_str(), global.ttl_ms, checked.check[0].cost),
        ("eu", 500, 2)
    );
    for hits in [0, 5] {
        let Err(Refusal::Invalid(why)) = call("edge", Some(hits), None) else {
            panic!("a global limit's own hits {hits} are refused");
        };
        assert!(why.contains("global"), "{why}");
    }
    let wanted = || {
        Some(LimitOverride {
            requests_per_unit: 10,
            unit: 3,
        })
    };
    let unconfigured = call("elsewhere", None, wanted()).unwrap();
    assert!(unconfigured.check.is_empty() && unconfigured.descriptors[0].ask == Ask::Free);
    let configured = call("edge", None, wanted()).unwrap();
    assert_eq!(configured.check[0].burst, 10);
    let refused = [
        "unit: second, requests_per_unit: 0, global: {}",
        "unlimited: true, global: {}",
    ];
    for rate_limit in refused {
        let yaml =
            format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{rate_limit}}}\n");
        let why = Limits::parse([("d.yaml", yaml.as_str())], false).unwrap_err();
        assert!(why.contains("global needs a bucket"), "{why}");
    }
    let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, global: {home: EU}}\n";
    let why = Limits::parse([("d.yaml", bad)], false).unwrap_err();
    assert!(why.contains("rate_limit.global.home"), "{why}");
}

/// An in-flight limit (`rate_limit.in_flight`): its slot taken by a descriptor ending in
/// `ratelimit.slot`, given back by one ending in `ratelimit.release`, both naming the slot
/// by a digest of the request's id; without an id it is over, never unlimited; a slot
/// marker on a rate limit is the caller's mistake.
#[test]
fn in_flight_limits_take_and_release_a_slot_named_by_the_request_s_id() {
    let yaml = "domain: llm
descriptors:
  - key: user
    rate_limit: {in_flight: {max: 4, ttl: 10m}}
  - key: plan
    rate_limit: {unit: second, requests_per_unit: 20}
";
    let limits = Limits::parse([("llm.yaml", yaml)], false).unwrap();
    let call = |key: &str, marker: Option<(&str, &str)>| {
        let mut entries = vec![Entry {
            key: key.into(),
            value: "alice".into(),
        }];
        entries.extend(marker.map(|(key, value)| Entry {
            key: key.into(),
            value: value.into(),
        }));
        let request = RateLimitRequest {
            domain: "llm".into(),
            descriptors: vec![RateLimitDescriptor {
                entries,
                limit: None,
                hits_addend: None,
            }],
            hits_addend: 0,
        };
        lines(&limits, &request, "rl", "id")
    };
    let take = call("user", Some((SLOT, "b7f0-req-1"))).unwrap();
    let taken = &take.check[0];
    let slot = taken.slot.as_ref().unwrap();
    assert_eq!((taken.burst, taken.cost, slot.ttl_ms), (4, 1, 600_000));
    assert_eq!(slot.id, sha256_hex(b"b7f0-req-1"));
    assert!(ratelimit_protocol::valid_settlement_id(&slot.id));
    let release = call("user", Some((RELEASE, "b7f0-req-1"))).unwrap();
    assert!(release.check.is_empty() && release.descriptors[0].ask == Ask::Release);
    assert_eq!(release.release[0].slot, taken.slot);
    assert_eq!(release.release[0].key, taken.key);
    // Any id names a slot, even one no header could hold as it is.
    let odd = call("user", Some((SLOT, "a b,c|d\n"))).unwrap();
    assert_eq!(odd.check[0].slot.as_ref().unwrap().id.len(), 64);
    let bare = call("user", None).unwrap();
    assert!(bare.check.is_empty() && bare.descriptors[0].ask == Ask::Over);
    assert!(matches!(
        call("plan", Some((SLOT, "x"))),
        Err(Refusal::Invalid(_))
    ));
    for bad in [
        "{in_flight: {max: 4}, unit: second}",
        "{in_flight: {max: 0}}",
    ] {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {bad}\n");
        assert!(
            Limits::parse([("d.yaml", yaml.as_str())], false).is_err(),
            "{bad}"
        );
    }
}
