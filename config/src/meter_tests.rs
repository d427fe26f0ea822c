use crate::config::Config;
use crate::loading::{load, Build};

fn rule_with(meter: &str) -> String {
    format!(
        r#"{{"backend": {{"cluster": "b"}}, "rules": [{{"name": "tokens", "limit": {{"requests": 1000, "per": "1m"}},
             "meter": {meter}}}]}}"#
    )
}

fn loaded(meter: &str) -> Result<Config, String> {
    load(rule_with(meter).as_bytes(), Build::Bridge).map_err(|e| e.to_string())
}

#[test]
fn a_meter_reads_weighted_body_fields_or_a_header_and_reserves_by_default_or_on_request() {
    let config = loaded(
        r#"{"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 4,
                     "usage.prompt_tokens_details.cached_tokens": -1},
            "header": "X-Usage-Tokens",
            "reserve": {"header": "X-Max-Tokens", "default": 50, "max": 400}}"#,
    )
    .unwrap();
    let rule = &config.rules[0];
    let meter = rule.meter.as_ref().unwrap();
    assert_eq!(rule.cost, 50, "a check reserves the default");
    assert_eq!(meter.header.as_deref(), Some("x-usage-tokens"));
    assert_eq!(meter.reserve_header.as_deref(), Some("x-max-tokens"));
    // Owed in full by default: as deep as 1000 tokens of 60 units (a minute's) stay exact.
    assert_eq!(
        (meter.reserve, meter.max_reserve, meter.debt),
        (50, 400, (((1 << 53) - 1) / 60) - 1000)
    );
    assert!(u128::from(1000 + meter.debt) * 60 < 1 << 53);
    let paths: Vec<String> = meter.paths().iter().map(|p| p.join("/")).collect();
    assert_eq!(
        paths,
        [
            "usage/completion_tokens",
            "usage/prompt_tokens",
            "usage/prompt_tokens_details/cached_tokens"
        ]
    );
    // 20 x 4 + 30 - 10 cached; a field never seen counts nothing; none seen: no cost.
    assert_eq!(meter.cost_of(&[Some(20), Some(30), Some(10)]), Some(100));
    assert_eq!(meter.cost_of(&[None, Some(30), None]), Some(30));
    assert_eq!(
        meter.cost_of(&[None, None, Some(10)]),
        Some(0),
        "never below 0"
    );
    assert_eq!(meter.cost_of(&[None, None, None]), None);
    let fixed = loaded(r#"{"header": "x-cost", "reserve": 10, "debt": 0}"#).unwrap();
    let meter = fixed.rules[0].meter.as_ref().unwrap();
    assert_eq!((meter.reserve, meter.max_reserve, meter.debt), (10, 10, 0));
    assert_eq!(fixed.rules[0].cost, 10);
    assert!(meter.reserve_body.is_empty());
}

#[test]
fn a_reservation_may_be_asked_in_fields_of_the_request_body_with_or_without_a_header() {
    let config = loaded(
        r#"{"body": {"usage.total_tokens": 1},
            "reserve": {"body": ["max_tokens", "options.max_completion_tokens"],
                        "default": 20, "max": 300}}"#,
    )
    .unwrap();
    let meter = config.rules[0].meter.as_ref().unwrap();
    assert_eq!(meter.reserve_header, None);
    assert_eq!(
        meter.reserve_body,
        [
            vec!["max_tokens".to_string()],
            vec!["options".to_string(), "max_completion_tokens".to_string()]
        ]
    );
    assert_eq!((meter.reserve, meter.max_reserve), (20, 300));
    assert_eq!(config.rules[0].cost, 20, "a check reserves the default");
    let both = loaded(
        r#"{"header": "x-c", "reserve": {"header": "x-max", "body": ["max_tokens"], "default": 5}}"#,
    )
    .unwrap();
    let meter = both.rules[0].meter.as_ref().unwrap();
    assert_eq!(meter.reserve_header.as_deref(), Some("x-max"));
    assert_eq!(meter.reserve_body.len(), 1);
    assert_eq!(meter.max_reserve, 1000, "max defaults to the burst");
}

#[test]
fn a_meter_that_cannot_work_is_refused_naming_its_field() {
    for (meter, field) in [
        (r#"{"reserve": 10}"#, "rules[0].meter"),
        (r#"{"header": "x-c"}"#, "rules[0].meter"),
        (
            r#"{"header": "x c", "reserve": 10}"#,
            "rules[0].meter.header",
        ),
        (
            r#"{"header": "x-c", "reserve": 0}"#,
            "rules[0].meter.reserve",
        ),
        (
            r#"{"header": "x-c", "reserve": 1001}"#,
            "rules[0].meter.reserve",
        ),
        (r#"{"header": "x-c", "reserve": -1}"#, "rules[0].meter"),
        (
            r#"{"header": "x-c", "reserve": {"header": "x-m", "default": 5, "max": 2000}}"#,
            "rules[0].meter.reserve.max",
        ),
        (
            r#"{"header": "x-c", "reserve": {"header": "x-m", "default": 50, "max": 20}}"#,
            "rules[0].meter.reserve.default",
        ),
        (
            r#"{"header": "x-c", "reserve": {"default": 50}}"#,
            "rules[0].meter.reserve",
        ),
        (
            r#"{"header": "x-c", "reserve": {"body": [], "default": 50}}"#,
            "rules[0].meter.reserve",
        ),
        (
            r#"{"header": "x-c", "reserve": {"body": ["max_tokens", "max_tokens"], "default": 5}}"#,
            "rules[0].meter.reserve.body[1]",
        ),
        (
            r#"{"header": "x-c", "reserve": {"body": ["a", "b", "c", "d", "e"], "default": 5}}"#,
            "rules[0].meter.reserve.body",
        ),
        (
            r#"{"header": "x-c", "reserve": {"body": ["usage..max"], "default": 5}}"#,
            "rules[0].meter.reserve.body[0]",
        ),
        (
            r#"{"header": "x-c", "reserve": {"body": "max_tokens", "default": 5}}"#,
            "rules[0].meter",
        ),
        (
            r#"{"body": {"usage..x": 1}, "reserve": 1}"#,
            "rules[0].meter.body.usage..x",
        ),
        (
            r#"{"body": {"a.b.c.d.e.f.g.h.i": 1}, "reserve": 1}"#,
            "rules[0].meter.body.a.b.c.d.e.f.g.h.i",
        ),
        (
            r#"{"body": {"usage.x": 0}, "reserve": 1}"#,
            "rules[0].meter.body.usage.x",
        ),
        (
            r#"{"body": {"usage.x": 1001}, "reserve": 1}"#,
            "rules[0].meter.body.usage.x",
        ),
        (
            r#"{"body": {"usage.x": -1}, "reserve": 1}"#,
            "rules[0].meter.body",
        ),
        (
            r#"{"body": {"usage.x": 1.5}, "reserve": 1}"#,
            "rules[0].meter.body.usage.x",
        ),
        (
            r#"{"header": "x-c", "reserve": 1, "debt": 9007199254740991}"#,
            "rules[0].meter.debt",
        ),
        (
            r#"{"header": "x-c", "reserve": 1, "debt": -5}"#,
            "rules[0].meter.debt",
        ),
        (
            r#"{"header": "x-c", "reserve": 1, "spare": 1}"#,
            "rules[0].meter.spare",
        ),
    ] {
        let error = loaded(meter).unwrap_err();
        assert!(error.contains(&format!("{field}:")), "{meter}: {error}");
    }
    let many: Vec<String> = (0..17).map(|i| format!(r#""f{i}": 1"#)).collect();
    let error = loaded(&format!(
        r#"{{"body": {{{}}}, "reserve": 1}}"#,
        many.join(",")
    ))
    .unwrap_err();
    assert!(error.contains("rules[0].meter.body:"), "{error}");
}

#[test]
fn a_metered_rule_takes_no_fixed_cost_nor_lease_and_its_tiers_must_hold_its_reservations() {
    let with = |extra: &str| {
        load(
            format!(
                r#"{{"backend": {{"cluster": "b"}},
                    "identity": {{"tier": {{"header": "x-tier", "trusted": true}}}},
                    "rules": [{{"name": "t", "limit": {{"requests": 1000, "per": "1m"}},
                    "meter": {{"header": "x-c", "reserve": 100}}{extra}}}]}}"#
            )
            .as_bytes(),
            Build::Bridge,
        )
        .map_err(|e| e.to_string())
    };
    assert!(with("").is_ok());
    let cost = with(r#", "cost": 5"#).unwrap_err();
    assert!(cost.contains("rules[0].cost:"), "{cost}");
    let lease = with(r#", "lease": {"tokens": 10}"#).unwrap_err();
    assert!(lease.contains("rules[0].lease:"), "{lease}");
    let tier = with(r#", "tiers": {"free": {"requests": 50, "per": "1m"}}"#).unwrap_err();
    assert!(tier.contains("rules[0].tiers.free:"), "{tier}");
    assert!(with(r#", "tiers": {"pro": {"requests": 5000, "per": "1m"}}"#).is_ok());
}

#[test]
fn the_default_debt_is_the_deepest_every_tier_holds_exactly() {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"plan": {"header": "x-plan", "trusted": true}},
        "rules": [{"name": "tokens", "limit": {"requests": 1000, "per": "1m"},
                   "tier_identity": "plan",
                   "tiers": {"slow": {"requests": 1000, "per": "30d"}},
                   "meter": {"header": "x-cost", "reserve": 10}}]}"#;
    let config = load(json.as_bytes(), Build::Bridge).unwrap();
    let meter = config.rules[0].meter.as_ref().unwrap();
    // 30 days of 1000: 2,592,000 units a token, the tier's, not the rule's 60.
    assert_eq!(meter.debt, ((1 << 53) - 1) / 2_592_000 - 1000);
    assert_eq!(meter.debt, 3_474_998_712);
}
