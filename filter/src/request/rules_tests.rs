use super::*;
use crate::fakes::{example, FakeRequest};
use crate::request::matcher::{matches, Methods};
use ratelimit_config::config::Config;
use ratelimit_config::keys::MAX_VALUE_LEN;
use ratelimit_config::matcher::Matcher;
use ratelimit_protocol::MAX_KEY_LEN;

/// The rules planned for a request that repeats no identity header.
fn plan(config: &Config, req: &FakeRequest) -> Vec<PlannedRule> {
    super::plan(config, req, None, |_| {}).unwrap()
}

fn request(method: &str, path: &str) -> FakeRequest {
    FakeRequest::default()
        .with(":method", method)
        .with(":path", path)
        .peer_at("198.51.100.4:40000")
}

fn names(config: &Config, planned: &[PlannedRule]) -> Vec<String> {
    planned
        .iter()
        .map(|p| config.rules[p.rule].name.clone())
        .collect()
}

#[test]
fn every_applicable_rule_is_planned_with_its_key() {
    let c = example("closed");
    let req = request("GET", "/api/search?q=cats")
        .with("x-user-id", "alice")
        .with("x-api-key", "k1");
    let planned = plan(&c, &req);
    assert_eq!(
        names(&c, &planned),
        ["per-user", "search-per-ip", "uploads", "global"]
    );
    let keys: Vec<_> = planned.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "rl:per-user:alice",
            "rl:search-per-ip:198.51.100.4",
            "rl:uploads:k1",
            "rl:global"
        ]
    );
    assert_eq!(planned[2].cost, 5);
}

#[test]
fn path_and_method_conditions_select_rules() {
    let c = example("closed");
    let post = plan(&c, &request("POST", "/api/search").with("x-user-id", "a"));
    assert_eq!(names(&c, &post), ["per-user", "global"]);
    let outside = plan(&c, &request("GET", "/health").with("x-user-id", "a"));
    assert_eq!(names(&c, &outside), ["global"]);
    // The query string is not part of the path.
    let query = plan(&c, &request("GET", "/x?/api/search").with("x-user-id", "a"));
    assert_eq!(names(&c, &query), ["global"]);
}

#[test]
fn rules_match_the_normalized_path_however_it_is_written() {
    let c = example("closed");
    for path in [
        "/api//search",
        "/api/%73earch?q=1",
        "/api/x/../search",
        "//api/./%2e/search",
    ] {
        let planned = plan(&c, &request("GET", path).with("x-user-id", "a"));
        assert_eq!(
            names(&c, &planned),
            ["per-user", "search-per-ip", "global"],
            "{path}"
        );
    }
    // An escaped slash is no separator: this path is not under /api/.
    let escaped = plan(&c, &request("GET", "/api%2Fsearch").with("x-user-id", "a"));
    assert_eq!(names(&c, &escaped), ["global"]);
}

#[test]
fn rules_whose_identity_is_missing_are_skipped() {
    let c = example("closed");
    let anonymous = plan(&c, &request("GET", "/api/profile"));
    assert_eq!(names(&c, &anonymous), ["global"]);
}

#[test]
fn exact_path_matches_only_that_path() {
    let m = Matcher {
        path: Some("/login".into()),
        ..Matcher::default()
    };
    let post = Methods {
        own: b"POST",
        overrides: Vec::new(),
    };
    assert!(matches(&m, &post, b"/login"));
    assert!(!matches(&m, &post, b"/login/x"));
}

#[test]
fn a_tier_selects_its_own_limit() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"},
            "identity": {"user": {"header": "x-user-id"}, "tier": {"header": "x-tier", "trusted": true}},
            "rules": [{"name": "r", "key": ["user"], "limit": {"requests": 10, "per": "1m"},
                       "tiers": {"premium": {"requests": 100, "per": "1m"}}}]}"#,
    )
    .unwrap();
    let basic = plan(&c, &request("GET", "/").with("x-user-id", "u"));
    assert_eq!(basic[0].limit.burst, 10);
    let premium = plan(
        &c,
        &request("GET", "/")
            .with("x-user-id", "u")
            .with("x-tier", "premium"),
    );
    assert_eq!(premium[0].limit.burst, 100);
    assert_eq!(
        premium[0].key, basic[0].key,
        "the tier changes the limit, not the bucket"
    );
    let unknown = plan(
        &c,
        &request("GET", "/")
            .with("x-user-id", "u")
            .with("x-tier", "gold"),
    );
    assert_eq!(unknown[0].limit.burst, 10);
}

#[test]
fn composite_keys_join_identities_in_rule_order() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"},
            "identity": {"user": {"header": "x-user-id"}, "ip": {"source": "peer"}},
            "rules": [{"name": "r", "key": ["ip", "user"], "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let planned = plan(&c, &request("GET", "/").with("x-user-id", "bob"));
    assert_eq!(planned[0].key, "rl:r:198.51.100.4:bob");
}

#[test]
fn method_and_path_are_read_only_when_a_rule_matches_on_them() {
    let unmatched = Config::parse(
        br#"{"backend": {"cluster": "b"}, "identity": {"user": {"header": "x-user-id"}},
            "rules": [{"name": "r", "key": ["user"], "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let req = request("GET", "/x").with("x-user-id", "alice");
    assert_eq!(plan(&unmatched, &req).len(), 1);
    assert_eq!(*req.reads.borrow(), ["x-user-id"]);
    let req = request("GET", "/api/x").with("x-user-id", "alice");
    plan(&example("closed"), &req);
    assert_eq!(req.reads.borrow()[..2], [":method", ":path"]);
}

#[test]
fn keys_stay_within_the_bridge_bound_whatever_the_values() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"},
             "identity": {"a": {"header": "x-a"}, "b": {"header": "x-b"},
                          "c": {"header": "x-c"}, "d": {"header": "x-d"}},
             "rules": [{"name": "four", "key": ["a", "b", "c", "d"],
                        "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let key_of = |fill: &str| {
        let value = fill.repeat(MAX_VALUE_LEN);
        let req = ["x-a", "x-b", "x-c", "x-d"]
            .into_iter()
            .fold(FakeRequest::default(), |r, h| r.with(h, &value));
        plan(&c, &req).remove(0).key
    };
    let (a, b) = (key_of("a"), key_of("b"));
    for key in [&a, &b] {
        assert!(key.len() <= MAX_KEY_LEN, "{key}");
        assert!(key.starts_with("rl:four:#") && key.len() == "rl:four:#".len() + 64);
    }
    assert_ne!(a, b, "different clients keep different buckets");
    assert_eq!(a, key_of("a"), "the same client keeps its bucket");
    let short = plan(
        &c,
        &["x-a", "x-b", "x-c", "x-d"]
            .into_iter()
            .fold(FakeRequest::default(), |r, h| r.with(h, "v")),
    );
    assert_eq!(short[0].key, "rl:four:v:v:v:v");
}

#[test]
fn a_request_in_a_match_rules_entry_gets_that_entrys_rules_only() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "x-u"}},
            "rules": [{"name": "everywhere", "key": ["u"], "limit": {"requests": 5, "per": "1h"}}],
            "_rules_": [
              {"_match_domain_": ["*.example.com"],
               "rules": [{"name": "tenants", "key": ["u"], "limit": {"requests": 2, "per": "1h"}},
                         {"name": "tenant-reads", "match": {"methods": ["GET"]},
                          "limit": {"requests": 9, "per": "1h"}}]},
              {"_match_route_": ["orders"],
               "rules": [{"name": "orders", "limit": {"requests": 3, "per": "1h"}}]}]}"#,
    )
    .unwrap();
    let on = |authority: &str, route: Option<&str>| {
        let mut req = request("GET", "/x")
            .with(":authority", authority)
            .with("x-u", "al");
        req.route = route.map(|r| r.as_bytes().to_vec());
        names(&c, &plan(&c, &req))
    };
    assert_eq!(
        on("a.example.com", Some("orders")),
        ["tenants", "tenant-reads"]
    );
    assert_eq!(on("shop.test", Some("orders")), ["orders"]);
    assert_eq!(on("shop.test", Some("other")), ["everywhere"]);
    assert_eq!(on("shop.test", None), ["everywhere"]);
    let keys: Vec<String> = plan(
        &c,
        &request("GET", "/")
            .with(":authority", "x.example.com")
            .with("x-u", "al"),
    )
    .into_iter()
    .map(|p| p.key)
    .collect();
    assert_eq!(keys, ["rl:tenants:al", "rl:tenant-reads"]);
}

/// Rules `per-key` on `api_key` (an identity that denies when missing), `per-user` on
/// `user` (which skips), `lenient` (per key, but the rule skips) and `trial` (per user,
/// denies, in shadow mode).
fn missing_config() -> Config {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"api_key": {"header": "x-api-key", "missing": "deny"},
                     "user": {"jwt": {"header": "x-jwt-payload", "claim": "sub"}}},
        "rules": [
          {"name": "per-user", "key": ["user"], "limit": {"requests": 9, "per": "1m"}},
          {"name": "per-key", "key": ["api_key"], "limit": {"requests": 9, "per": "1m"}},
          {"name": "lenient", "key": ["api_key"], "missing": "skip", "limit": {"requests": 9, "per": "1m"}},
          {"name": "trial", "key": ["user"], "missing": "deny", "mode": "shadow", "limit": {"requests": 9, "per": "1m"}}]}"#;
    Config::parse(json.as_bytes()).unwrap()
}

#[test]
fn a_request_lacking_an_identity_a_rule_denies_without_is_refused() {
    let c = missing_config();
    let mut shadowed = Vec::new();
    let no_key = FakeRequest::default().with("x-jwt-payload", "eyJzdWIiOiJib2IifQ");
    let refused = super::plan(&c, &no_key, None, |r| shadowed.push(r));
    assert_eq!(
        refused,
        Err(Unplanned::Missing {
            rule: 1,
            identity: 0
        })
    );
    // An empty value is no value; so is a JWT without the claim.
    for empty in [
        FakeRequest::default().with("x-api-key", "  "),
        FakeRequest::default().with("x-jwt-payload", "e30"),
    ] {
        let refused = super::plan(&c, &empty, None, |_| {});
        assert!(
            matches!(refused, Err(Unplanned::Missing { rule: 1, .. })),
            "{refused:?}"
        );
    }
    assert!(shadowed.is_empty());
    // With the key, every rule applies; without the user, `per-user` is skipped and the
    // shadow rule that denies is only reported.
    let keyed = FakeRequest::default().with("x-api-key", "k1");
    let planned = super::plan(&c, &keyed, None, |r| shadowed.push(r)).unwrap();
    assert_eq!(names(&c, &planned), ["per-key", "lenient"]);
    assert_eq!(shadowed, [3]);
}

#[test]
fn a_rules_missing_overrides_its_identities() {
    // The identity denies, but the rule that says skip is simply not applied; and a rule
    // that says deny refuses for an identity that would skip.
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"api_key": {"header": "x-api-key", "missing": "deny"},
                     "user": {"header": "x-user-id"}},
        "rules": [
          {"name": "lenient", "key": ["api_key"], "missing": "skip", "limit": {"requests": 9, "per": "1m"}},
          {"name": "pair", "key": ["api_key", "user"], "missing": "deny", "limit": {"requests": 9, "per": "1m"}}]}"#;
    let c = Config::parse(json.as_bytes()).unwrap();
    assert_eq!(c.rules[0].missing, [Missing::Skip]);
    assert_eq!(c.rules[1].missing, [Missing::Deny, Missing::Deny]);
    let no_user = FakeRequest::default().with("x-api-key", "k1");
    let refused = super::plan(&c, &no_user, None, |_| {});
    assert_eq!(
        refused,
        Err(Unplanned::Missing {
            rule: 1,
            identity: 1
        })
    );
    let both = no_user.with("x-user-id", "u");
    assert_eq!(plan(&c, &both).len(), 2);
    // A repeated header is still the 400 it was, not a missing identity.
    let repeated = FakeRequest::default()
        .with("x-api-key", "k1")
        .twice("x-api-key");
    assert!(matches!(
        super::plan(&c, &repeated, None, |_| {}),
        Err(Unplanned::Bad(_))
    ));
}

#[test]
fn a_quota_request_looks_at_every_rule_its_identities_key_whatever_they_match() {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"user": {"header": "x-user-id"}, "model": {"body": "model"},
                     "tier": {"header": "x-tier", "trusted": true}},
        "rules": [
            {"name": "quota-api", "key": ["user"], "match": {"path": "/v1/quota"},
             "limit": {"requests": 10, "per": "1m"}},
            {"name": "chat", "key": ["user"], "match": {"path_prefix": "/v1/chat"},
             "limit": {"requests": 100, "per": "1m"},
             "tiers": {"gold": {"requests": 1000, "per": "1m"}}},
            {"name": "streams", "key": ["user"], "in_flight": {"max": 4}},
            {"name": "per-model", "key": ["user", "model"], "match": {"path_prefix": "/v1/chat"},
             "limit": {"requests": 5, "per": "1m"}},
            {"name": "watch", "key": ["user"], "limit": {"requests": 1, "per": "1m"},
             "mode": "shadow"},
            {"name": "everyone", "limit": {"requests": 50000, "per": "1s"}}]}"#;
    let c = Config::parse(json.as_bytes()).unwrap();
    let req = request("GET", "/v1/quota")
        .with("x-user-id", "alice")
        .with("x-tier", "gold");
    let charged = plan(&c, &req);
    assert_eq!(
        names(&c, &charged),
        ["quota-api", "streams", "watch", "everyone"]
    );
    let looks = super::looks(&c, &req, &charged);
    // Not the charged ones, nor a shadow rule, nor one keyed on the body it has not.
    assert_eq!(names(&c, &looks), ["chat"]);
    assert_eq!(
        (looks[0].cost, looks[0].shadow, looks[0].limit.burst),
        (0, true, 1000)
    );
    // A client without the identity has nothing of that rule to read.
    let anonymous = request("GET", "/v1/quota");
    let charged = plan(&c, &anonymous);
    assert_eq!(names(&c, &charged), ["everyone"]);
    assert!(super::looks(&c, &anonymous, &charged).is_empty());
}
