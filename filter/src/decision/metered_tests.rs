use super::*;
use crate::fakes;
use ratelimit_config::loading::{load, Build};

fn config() -> Config {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"key": {"header": "x-api-key"}},
        "rules": [
          {"name": "tokens", "key": ["key"], "limit": {"requests": 1000, "per": "1m"},
           "meter": {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 2},
                     "header": "x-usage-tokens", "reserve": 100, "debt": 500}},
          {"name": "plain", "key": ["key"], "limit": {"requests": 10, "per": "1s"}}
        ]}"#;
    load(json.as_bytes(), Build::Bridge).unwrap()
}

fn planned(rule: usize, cost: u64) -> PlannedRule {
    PlannedRule {
        rule,
        ..fakes::planned(&format!("rl:r{rule}:k"), 1000, 1, 60, cost)
    }
}

fn took() -> RuleResult {
    RuleResult {
        allowed: true,
        ..RuleResult::default()
    }
}

fn metering(config: &Config) -> Metering {
    let plan = [planned(0, 100), planned(1, 1)];
    Metering::reserved(config, &plan, &[took(), took()]).unwrap()
}

fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
    move |name| {
        let found = pairs.iter().find(|(n, _)| *n == name);
        found.map(|(_, v)| v.as_bytes().to_vec())
    }
}

#[test]
fn only_metered_rules_are_kept_and_a_request_without_one_has_no_metering() {
    let config = config();
    assert!(Metering::reserved(&config, &[planned(1, 1)], &[took()]).is_none());
    assert_eq!(metering(&config).rules.len(), 1);
}

#[test]
fn a_streamed_usage_settles_the_difference_with_its_reservation() {
    let config = config();
    let mut m = metering(&config);
    assert!(m.response_headers(&config, headers(&[("content-type", "text/event-stream")])));
    m.body(b"data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tok");
    m.body(b"ens\":30,\"completion_tokens\":50}}\n\ndata: [DONE]\n\n");
    let s = m.settle(&config, "w1-1");
    // 30 + 2 x 50 = 130 measured, 100 reserved: 30 more.
    assert_eq!(s.measured, 130);
    assert_eq!(s.line.as_deref(), Some("= w1-1 rl:r0:k,1000,1,60,30,500\n"));
}

#[test]
fn unused_tokens_go_back_and_a_header_decides_over_the_body() {
    let config = config();
    let mut m = metering(&config);
    let h = [
        ("content-type", "application/json"),
        ("x-usage-tokens", "7"),
    ];
    assert!(
        !m.response_headers(&config, headers(&h)),
        "the body need not be read"
    );
    let s = m.settle(&config, "w1-2");
    assert_eq!(
        s.line.as_deref(),
        Some("= w1-2 rl:r0:k,1000,1,60,-93,500\n")
    );
}

#[test]
fn a_response_that_measured_nothing_usable_keeps_its_reservation() {
    let config = config();
    for (content_type, body) in [
        (
            "application/json",
            &b"{\"usage\": {\"prompt_tokens\": \"12\"}}"[..],
        ),
        ("application/json", b"{\"usage\": {\"prompt_tokens\": -4}}"),
        (
            "application/json",
            b"{\"usage\": {\"prompt_tokens\": 1000000000000000000000000000000}}",
        ),
        ("application/json", b"{\"choices\": []}"),
        ("application/json", b"\x00\xffgarbage"),
        ("text/plain", b"{\"usage\": {\"prompt_tokens\": 5}}"),
    ] {
        let mut m = metering(&config);
        m.response_headers(&config, headers(&[("content-type", content_type)]));
        m.body(body);
        let s = m.settle(&config, "w1-3");
        assert_eq!(s.line, None, "{content_type} {body:?}");
    }
    // A header that is no count is as good as none.
    for bad in ["-5", "1e3", "12 tokens", "99999999999999999999", ""] {
        let mut m = metering(&config);
        m.response_headers(&config, headers(&[("x-usage-tokens", bad)]));
        assert_eq!(m.settle(&config, "w1-4").line, None, "{bad}");
    }
}

#[test]
fn a_huge_measure_takes_at_most_the_burst_and_the_debt() {
    let config = config();
    let mut m = metering(&config);
    m.response_headers(&config, headers(&[("x-usage-tokens", "9000000000000000")]));
    let s = m.settle(&config, "w1-5");
    // Reserved 100; at most 1000 + 500 more.
    assert_eq!(
        s.line.as_deref(),
        Some("= w1-5 rl:r0:k,1000,1,60,1500,500\n")
    );
}

#[test]
fn a_shadow_rule_that_took_nothing_settles_from_zero() {
    let config = config();
    let shadowed = RuleResult {
        wait_ms: 40,
        ..took()
    };
    let mut m = Metering::reserved(&config, &[planned(0, 100)], &[shadowed]).unwrap();
    m.response_headers(&config, headers(&[("x-usage-tokens", "60")]));
    let s = m.settle(&config, "w1-6");
    assert_eq!(s.line.as_deref(), Some("= w1-6 rl:r0:k,1000,1,60,60,500\n"));
}

#[test]
fn a_json_body_cut_short_keeps_its_reservation_though_a_field_came_before_the_cut() {
    let config = config();
    let mut m = metering(&config);
    m.response_headers(&config, headers(&[("content-type", "application/json")]));
    m.body(b"{\"usage\": {\"prompt_tokens\": 5, \"completion_to");
    assert_eq!(m.settle(&config, "w1-7").line, None);
}
