use super::*;
use crate::backend::Transport;
use crate::options::FailureMode;
use crate::source::{Address, Forwarded, Source};

/// The configuration the README and docs/configuration.md show.
const EXAMPLE: &str = include_str!("../../filter/example-config.json");

fn refused(json: &str) -> ConfigError {
    match Config::parse(json.as_bytes()) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => e,
    }
}

/// Takes the example and replaces one rule, to test one thing at a time.
fn with_rule(rule: &str) -> String {
    format!(
        r#"{{"backend": {{"cluster": "b"}}, "identity": {{"user": {{"header": "x-user-id"}},
            "tier": {{"header": "x-tier", "trusted": true}}}}, "rules": [{rule}]}}"#
    )
}

#[test]
fn the_documented_example_is_accepted() {
    let c = Config::parse(EXAMPLE.as_bytes()).unwrap();
    assert_eq!(c.backend.cluster, "ratelimit_bridge");
    assert_eq!(c.backend.authority, "ratelimit_bridge");
    assert_eq!(c.backend.timeout_ms, 25);
    assert_eq!(c.failure_mode, FailureMode::Closed);
    assert_eq!(c.rules.len(), 4);
    let names: Vec<_> = c.identities.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["api_key", "ip", "user"]);
    assert_eq!(c.rules[0].key, [2]);
    assert_eq!(c.rules[1].matcher.methods, ["GET"]);
    assert_eq!(c.rules[2].cost, 5);
    assert_eq!(c.rules[3].key, Vec::<usize>::new());
    assert_eq!(c.rules[3].limit.burst, 50_000);
    assert!(c.headers.on_allowed);
}

#[test]
fn defaults_apply_when_fields_are_omitted() {
    let c = Config::parse(
        with_rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1s"}}"#).as_bytes(),
    )
    .unwrap();
    assert_eq!(c.failure_mode, FailureMode::Closed);
    assert_eq!(c.key_prefix, "rl");
    assert_eq!(c.backend.timeout_ms, 25);
    assert_eq!(c.backend.transport, Transport::Grpc);
    assert_eq!(c.backend.max_inflight, 1);
    assert_eq!(c.rules[0].cost, 1);
    assert_eq!(c.rules[0].matcher, Matcher::default());
}

#[test]
fn every_identity_source_parses() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b", "authority": "bridge.local"},
            "identity": {
              "a": {"header": "X-User-ID"},
              "b": {"jwt": {"header": "x-jwt-payload"}},
              "c": {"jwt": {"header": "authorization", "claim": "uid", "unverified": true}},
              "d": {"source": "peer"},
              "e": {"source": "xff", "trusted_hops": 2, "ipv6_prefix": 56},
              "f": {"source": "xff", "gateway_appends": false}},
            "failure_mode": "open",
            "headers": {"on_allowed": false, "ietf_draft": true},
            "rules": [{"name": "r", "key": ["a","b","c","d","e","f"], "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let sources: Vec<_> = c.identities.iter().map(|i| i.source.clone()).collect();
    assert_eq!(
        sources,
        [
            Source::Header("x-user-id".into()),
            Source::Jwt {
                header: "x-jwt-payload".into(),
                claim: "sub".into(),
                unverified: false
            },
            Source::Jwt {
                header: "authorization".into(),
                claim: "uid".into(),
                unverified: true
            },
            Source::Address(Address {
                forwarded: None,
                ipv6_prefix: 64
            }),
            Source::Address(Address {
                forwarded: Some(Forwarded {
                    hops: 2,
                    gateway_appends: true
                }),
                ipv6_prefix: 56
            }),
            Source::Address(Address {
                forwarded: Some(Forwarded {
                    hops: 1,
                    gateway_appends: false
                }),
                ipv6_prefix: 64
            }),
        ]
    );
    assert_eq!(c.backend.authority, "bridge.local");
    assert_eq!(c.failure_mode, FailureMode::Open);
    assert!(!c.headers.on_allowed && c.headers.ietf_draft);
}

#[test]
fn tiers_select_limits_and_need_a_tier_identity() {
    let c = Config::parse(
        with_rule(
            r#"{"name": "r", "key": ["user"], "limit": {"requests": 10, "per": "1m"},
                "tiers": {"premium": {"requests": 100, "per": "1m"}}}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.rules[0].tiers[0].0, "premium");
    assert_eq!(c.rules[0].tiers[0].1.burst, 100);
    assert_eq!(c.identities[c.rules[0].tier_identity.unwrap()].name, "tier");
    let e = refused(&with_rule(
        r#"{"name": "r", "limit": {"requests": 10, "per": "1m"}, "tier_identity": "plan",
            "tiers": {"premium": {"requests": 100, "per": "1m"}}}"#,
    ));
    assert_eq!(e.field, "rules[0].tier_identity");
}

#[test]
fn only_a_value_the_client_cannot_write_may_pick_a_tier() {
    let tiered = |identity: &str| {
        format!(
            r#"{{"backend": {{"cluster": "b"}}, "identity": {{"tier": {identity}}},
                "rules": [{{"name": "r", "limit": {{"requests": 1, "per": "1s"}},
                            "tiers": {{"gold": {{"requests": 9, "per": "1s"}}}}}}]}}"#
        )
    };
    for client_written in [
        r#"{"header": "x-tier"}"#,
        r#"{"header": "x-tier", "trusted": false}"#,
        r#"{"jwt": {"header": "authorization", "claim": "tier", "unverified": true}}"#,
    ] {
        let e = refused(&tiered(client_written));
        assert_eq!(e.field, "rules[0].tier_identity", "{client_written}");
        assert!(e.problem.contains("pick its own tier"), "{e}");
    }
    for trusted in [
        r#"{"header": "x-tier", "trusted": true}"#,
        r#"{"jwt": {"header": "x-jwt-payload", "claim": "tier"}}"#,
        r#"{"jwt": {"header": "authorization", "claim": "tier", "unverified": true}, "trusted": true}"#,
        r#"{"source": "peer"}"#,
    ] {
        assert!(
            Config::parse(tiered(trusted).as_bytes()).is_ok(),
            "{trusted}"
        );
    }
    for (misplaced, field) in [
        (
            r#"{"source": "peer", "trusted": true}"#,
            "identity.tier.trusted",
        ),
        (
            r#"{"jwt": {"header": "x-jwt-payload"}, "trusted": true}"#,
            "identity.tier.trusted",
        ),
        (
            r#"{"header": "x", "ipv6_prefix": 48}"#,
            "identity.tier.ipv6_prefix",
        ),
        (
            r#"{"source": "peer", "ipv6_prefix": 0}"#,
            "identity.tier.ipv6_prefix",
        ),
        (
            r#"{"source": "peer", "ipv6_prefix": 129}"#,
            "identity.tier.ipv6_prefix",
        ),
    ] {
        assert_eq!(refused(&tiered(misplaced)).field, field, "{misplaced}");
    }
}

#[test]
fn bad_configs_are_refused_naming_the_field() {
    let rule = |r: &str| with_rule(r);
    let cases: Vec<(String, &str)> = vec![
        ("not json".into(), "config"),
        ("[]".into(), "config"),
        (r#"{"rules": []}"#.into(), "config"),
        (r#"{"backend": {"cluster": ""}, "rules": []}"#.into(), "backend.cluster"),
        (r#"{"backend": {"cluster": "b", "timeout_ms": 0}, "rules": []}"#.into(), "backend.timeout_ms"),
        (r#"{"backend": {"cluster": "b", "max_inflight": 65}, "rules": []}"#.into(), "backend.max_inflight"),
        (r#"{"backend": {"cluster": "b", "transport": "udp"}, "rules": []}"#.into(), "backend.transport"),
        (r#"{"backend": {"cluster": "b", "token": ""}, "rules": []}"#.into(), "backend.token"),
        (r#"{"backend": {"cluster": "b", "token": "a b"}, "rules": []}"#.into(), "backend.token"),
        (r#"{"backend": {"cluster": "b", "token": "ok\r\nx-evil: 1"}, "rules": []}"#.into(), "backend.token"),
        (r#"{"backend": {"cluster": "b", "token": 7}, "rules": []}"#.into(), "backend.token"),
        (r#"{"backend": {"cluster": "b"}, "rules": []}"#.into(), "rules"),
        (r#"{"backend": {"cluster": "b"}, "rulez": []}"#.into(), "rulez"),
        (r#"{"backend": {"cluster": "b"}, "failure_mode": "maybe", "rules": []}"#.into(), "failure_mode"),
        (r#"{"backend": {"cluster": "b"}, "local_buckets": 8, "rules": []}"#.into(), "local_buckets"),
        (r#"{"backend": {"cluster": "b"}, "failure_mode": "local", "local_buckets": 0, "rules": []}"#.into(), "local_buckets"),
        (r#"{"backend": {"cluster": "b"}, "failure_mode": "local", "local_buckets": 65537, "rules": []}"#.into(), "local_buckets"),
        (r#"{"backend": {"cluster": "b"}, "key_prefix": "a:b", "rules": []}"#.into(), "key_prefix"),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "x", "source": "peer"}}, "rules": []}"#.into(),
            "identity.u",
        ),
        (r#"{"backend": {"cluster": "b"}, "identity": {"u": {}}, "rules": []}"#.into(), "identity.u"),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "bad header"}}, "rules": []}"#.into(),
            "identity.u.header",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"source": "xff", "trusted_hops": 0}}, "rules": []}"#.into(),
            "identity.u.trusted_hops",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"source": "peer", "trusted_hops": 1}}, "rules": []}"#.into(),
            "identity.u.trusted_hops",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"source": "peer", "gateway_appends": true}}, "rules": []}"#.into(),
            "identity.u.gateway_appends",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"u": {"source": "dns"}}, "rules": []}"#.into(),
            "identity.u.source",
        ),
        (rule(r#"{"name": "", "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].name"),
        (rule(r#"{"name": "a b", "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].name"),
        (rule(r#"{"name": "rls", "key": ["user"], "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].name"),
        (rule(r#"{"name": "r", "key": ["nobody"], "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].key[0]"),
        (rule(r#"{"name": "r", "key": ["user", "user"], "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].key[1]"),
        (rule(r#"{"name": "r", "limit": {"requests": 0, "per": "1s"}}"#), "rules[0].limit.requests"),
        (rule(r#"{"name": "r", "limit": {"requests": -1, "per": "1s"}}"#), "rules[0].limit.requests"),
        (rule(r#"{"name": "r", "limit": {"requests": "10", "per": "1s"}}"#), "rules[0].limit.requests"),
        (rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1 minute"}}"#), "rules[0].limit.per"),
        (rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1s", "burst": 0}}"#), "rules[0].limit.burst"),
        (rule(r#"{"name": "r", "limit": {"requests": 1}}"#), "rules[0].limit"),
        (rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1s", "extra": 1}}"#), "rules[0].limit"),
        (rule(r#"{"name": "r", "cost": 0, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].cost"),
        (rule(r#"{"name": "r", "cost": 5, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].limit.burst"),
        (rule(r#"{"name": "r", "match": {"path_prefix": "api"}, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].match.path_prefix"),
        (rule(r#"{"name": "r", "match": {"path_prefix": "/api/%73"}, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].match.path_prefix"),
        (rule(r#"{"name": "r", "match": {"path": "/api//search"}, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].match.path"),
        (rule(r#"{"name": "r", "match": {"methods": ["GET "]}, "limit": {"requests": 1, "per": "1s"}}"#), "rules[0].match.methods[0]"),
        (rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1s"}, "tiers": {"gold": {"requests": 1, "per": "1y"}}}"#), "rules[0].tiers.gold.per"),
        (
            rule(r#"{"name": "r", "limit": {"requests": 1, "per": "1s"}}, {"name": "r", "limit": {"requests": 1, "per": "1s"}}"#),
            "rules[1].name",
        ),
    ];
    for (json, field) in cases {
        let e = refused(&json);
        assert!(
            e.field == field
                || e.field.starts_with(&format!("{field}."))
                || e.field.starts_with(&format!("{field}[")),
            "{json}\n  expected field {field}, got {e}"
        );
        assert!(!e.problem.is_empty());
    }
}

#[test]
fn errors_read_as_field_then_problem() {
    let e = refused(&with_rule(
        r#"{"name": "r", "limit": {"requests": 1, "per": "soon"}}"#,
    ));
    assert_eq!(
        e.to_string(),
        "rules[0].limit.per: \"soon\" is not a duration like 500ms, 10s, 1m, 1h or 1d, nor a \
         calendar period (day, week, month, year)"
    );
}

#[test]
fn path_patterns_must_be_written_in_normal_form() {
    let e = refused(&with_rule(
        r#"{"name": "r", "match": {"path_prefix": "/api/./x%2f?"}, "limit": {"requests": 1, "per": "1s"}}"#,
    ));
    assert_eq!(
        e.to_string(),
        r#"rules[0].match.path_prefix: "/api/./x%2f?" is not in the normal form requests are matched in; write "/api/x%2F""#
    );
    let c = Config::parse(
        with_rule(
            r#"{"name": "r", "match": {"path": "/a%2Fb/", "path_prefix": "/a%2Fb"},
                "limit": {"requests": 1, "per": "1s"}}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.rules[0].matcher.path.as_deref(), Some("/a%2Fb/"));
    assert_eq!(c.rules[0].matcher.path_prefix.as_deref(), Some("/a%2Fb"));
}

#[test]
fn too_many_rules_are_refused() {
    let rules: Vec<String> = (0..=MAX_RULES)
        .map(|i| format!(r#"{{"name": "r{i}", "limit": {{"requests": 1, "per": "1s"}}}}"#))
        .collect();
    assert_eq!(refused(&with_rule(&rules.join(","))).field, "rules");
}

#[test]
fn the_backend_token_becomes_a_bearer_credential_never_shown() {
    let json = EXAMPLE.replace(
        r#""cluster": "ratelimit_bridge""#,
        r#""cluster": "ratelimit_bridge", "token": "s3cr3t-T0ken_~+/=""#,
    );
    let config = Config::parse(json.as_bytes()).unwrap();
    let authorization = config.backend.authorization.as_ref().unwrap();
    assert_eq!(authorization.expose(), "Bearer s3cr3t-T0ken_~+/=");
    assert!(!format!("{config:?}").contains("s3cr3t"));
    let bad = EXAMPLE.replace(
        r#""cluster": "ratelimit_bridge""#,
        r#""cluster": "ratelimit_bridge", "token": "s3cr3t with space""#,
    );
    let error = Config::parse(bad.as_bytes()).unwrap_err().to_string();
    assert!(
        error.starts_with("backend.token") && !error.contains("s3cr3t"),
        "{error}"
    );
    assert_eq!(
        Config::parse(EXAMPLE.as_bytes())
            .unwrap()
            .backend
            .authorization,
        None
    );
}
