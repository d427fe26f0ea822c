use super::*;
use crate::fakes::{self, FakeShared};
use ratelimit_config::loading::{load, Build};

/// A metered rule (prompt x1, completion x2; a header's cost decides; a reservation of
/// 100 unless `x-max-tokens` asks, at most 800; 500 of debt) and a plain rule.
fn config() -> Config {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"key": {"header": "x-api-key"}},
        "rules": [
          {"name": "tokens", "key": ["key"], "limit": {"requests": 1000, "per": "1m"},
           "meter": {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 2,
                              "usage.cached_tokens": -1},
                     "header": "x-usage-tokens",
                     "reserve": {"header": "x-max-tokens", "default": 100, "max": 800},
                     "debt": 500}},
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

/// A response of `status` and `content_type` whose body is `chunks`, ended or cut short:
/// its settlement.
fn settled(status: &str, content_type: &str, chunks: &[&[u8]], ended: bool) -> Settlement {
    let config = config();
    let mut m = metering(&config);
    m.response_headers(
        &config,
        headers(&[(":status", status), ("content-type", content_type)]),
    );
    for chunk in chunks {
        m.body(chunk);
    }
    if ended {
        m.ended();
    }
    m.settle(&config, "w1-1", &FakeShared::default(), 0)
}

/// The tokens a settlement takes beyond the reservation of 100 (below 0: gives back).
fn delta(s: &Settlement) -> i64 {
    let Some(line) = &s.line else { return 0 };
    let fields: Vec<&str> = line.trim_end().split(',').collect();
    fields[fields.len() - 2].parse().unwrap()
}

#[test]
fn only_metered_rules_are_kept_and_a_request_without_one_has_no_metering() {
    let config = config();
    assert!(Metering::reserved(&config, &[planned(1, 1)], &[took()]).is_none());
    assert_eq!(metering(&config).rules.len(), 1);
}

#[test]
fn a_streamed_usage_read_to_its_end_settles_the_difference_with_its_reservation() {
    let s = settled(
        "200",
        "text/event-stream",
        &[
            b"data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tok",
            b"ens\":30,\"completion_tokens\":50}}\n\ndata: [DONE]\n\n",
        ],
        true,
    );
    // 30 + 2 x 50 = 130 measured, 100 reserved: 30 more.
    assert_eq!((s.measured, s.unmeasured), (130, 0));
    assert_eq!(s.line.as_deref(), Some("= w1-1 rl:r0:k,1000,1,60,30,500\n"));
    // Less than reserved gives the rest back; a discount counts when read in full.
    let body = br#"{"usage": {"prompt_tokens": 40, "completion_tokens": 10, "cached_tokens": 20}}"#;
    let s = settled("200", "application/json", &[body], true);
    assert_eq!((s.measured, delta(&s)), (40, -60));
}

#[test]
fn unused_tokens_go_back_and_a_header_decides_over_the_body() {
    let config = config();
    let mut m = metering(&config);
    let h = [
        (":status", "200"),
        ("content-type", "application/json"),
        ("x-usage-tokens", "7"),
    ];
    assert!(
        !m.response_headers(&config, headers(&h)),
        "the body need not be read"
    );
    let s = m.settle(&config, "w1-2", &FakeShared::default(), 0);
    assert_eq!(
        s.line.as_deref(),
        Some("= w1-2 rl:r0:k,1000,1,60,-93,500\n")
    );
}

#[test]
fn a_success_the_meter_cannot_read_in_full_is_charged_the_max() {
    let usage = &b"{\"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 6}}"[..];
    let stream = &b"data: {\"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 6}}\n\n"[..];
    for (content_type, body, ended) in [
        (
            "application/json",
            &b"{\"usage\": {\"prompt_tokens\": \"12\"}}"[..],
            true,
        ),
        (
            "application/json",
            b"{\"usage\": {\"prompt_tokens\": -4}}",
            true,
        ),
        (
            "application/json",
            b"{\"usage\": {\"prompt_tokens\": 1000000000000000000000000000000}}",
            true,
        ),
        ("application/json", b"{\"choices\": []}", true),
        ("application/json", b"\x00\xffgarbage", true),
        ("application/json", b"", true),
        // Parsers disagree on a repeated key: which usage counts cannot be told.
        (
            "application/json",
            b"{\"usage\": {\"prompt_tokens\": 5, \"prompt_tokens\": 500}}",
            true,
        ),
        ("text/plain", usage, true),
        // Cut short, by either side, before the body's end.
        ("application/json", usage, false),
        ("text/event-stream", stream, false),
        // A stream that never reports its usage (OpenAI's, not asked to).
        (
            "text/event-stream",
            b"data: {\"choices\": []}\n\ndata: [DONE]\n\n",
            true,
        ),
        // An event cut inside its usage.
        (
            "text/event-stream",
            b"data: {\"usage\": {\"prompt_tokens\": 5, \"compl\n\ndata: [DONE]\n\n",
            true,
        ),
        // A count that goes down (every API's grow): the later event is one a strict
        // reader would not read (the fuzz target settle's find: invalid UTF-8 in it).
        (
            "text/event-stream",
            b"data: {\"usage\": {\"prompt_tokens\": 58}}\n\ndata: {\"usage\": {\"prompt_tokens\": 29}}\n\n",
            true,
        ),
    ] {
        let s = settled("200", content_type, &[body], ended);
        assert_eq!(
            (delta(&s), s.measured, s.unmeasured),
            (700, 0, 1),
            "{content_type} {body:?} ended {ended}"
        );
    }
}

#[test]
fn a_compressed_response_is_not_read_and_is_charged_the_max() {
    let config = config();
    for encoding in ["gzip", "br", "identity, gzip", "GZIP"] {
        let mut m = metering(&config);
        let h = [
            (":status", "200"),
            ("content-type", "application/json"),
            ("content-encoding", encoding),
        ];
        assert!(!m.response_headers(&config, headers(&h)), "{encoding}");
        m.ended();
        let s = m.settle(&config, "w1-3", &FakeShared::default(), 0);
        assert_eq!(delta(&s), 700, "{encoding}");
    }
    let mut m = metering(&config);
    let h = [
        (":status", "200"),
        ("content-type", "application/json"),
        ("content-encoding", " Identity "),
    ];
    assert!(m.response_headers(&config, headers(&h)), "identity is read");
}

#[test]
fn what_an_unread_response_showed_is_charged_when_it_is_more_than_the_max() {
    // A stream cut after a usage of 300 + 2 x 400 (the discount not given): 1100 > 800.
    let body = b"data: {\"usage\": {\"prompt_tokens\": 300, \"completion_tokens\": 400, \
                 \"cached_tokens\": 300}}\n\n";
    let s = settled("200", "text/event-stream", &[body], false);
    assert_eq!(delta(&s), 1000);
    // The largest of a repeated count, not the last.
    let twice = br#"{"usage": {"prompt_tokens": 900, "prompt_tokens": 5}}"#;
    assert_eq!(
        delta(&settled("200", "application/json", &[twice], true)),
        800
    );
}

#[test]
fn a_failed_response_that_reports_nothing_keeps_its_reservation() {
    for status in ["400", "429", "500", "503", "304", "bad"] {
        let s = settled(status, "application/json", &[b"{\"error\": {}}"], true);
        assert_eq!((s.line.clone(), s.unmeasured), (None, 1), "{status}");
    }
    // One that reports its usage pays it.
    let body = br#"{"usage": {"prompt_tokens": 3, "completion_tokens": 0}}"#;
    assert_eq!(
        delta(&settled("400", "application/json", &[body], true)),
        -97
    );
    // A header that is no count is as good as none.
    let config = config();
    for bad in ["-5", "1e3", "12 tokens", "99999999999999999999", ""] {
        let mut m = metering(&config);
        m.response_headers(
            &config,
            headers(&[(":status", "500"), ("x-usage-tokens", bad)]),
        );
        let s = m.settle(&config, "w1-4", &FakeShared::default(), 0);
        assert_eq!(s.line, None, "{bad}");
    }
}

#[test]
fn a_huge_measure_takes_at_most_the_burst_and_the_debt() {
    let config = config();
    let mut m = metering(&config);
    m.response_headers(&config, headers(&[("x-usage-tokens", "9000000000000000")]));
    let s = m.settle(&config, "w1-5", &FakeShared::default(), 0);
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
    let s = m.settle(&config, "w1-6", &FakeShared::default(), 0);
    assert_eq!(s.line.as_deref(), Some("= w1-6 rl:r0:k,1000,1,60,60,500\n"));
}

#[test]
fn a_request_that_meters_a_body_asks_for_an_uncompressed_response() {
    let config = config();
    assert!(reads_body(&config, [1, 0].into_iter()));
    assert!(!reads_body(&config, [1].into_iter()));
}

#[test]
fn a_locally_admitted_request_is_settled_in_the_local_buckets_past_zero() {
    let config = config();
    let store = FakeShared::default();
    let options = config.local;
    let plan = [planned(0, 100)];
    let names = ["tokens"];
    let admitted = local::admit(&store, &plan, &names, options, 0).unwrap();
    assert_eq!(admitted[0].remaining, 900);
    let settle = |usage: &str| {
        let mut m = Metering::reserved_locally(&config, &plan, &admitted).unwrap();
        m.response_headers(&config, headers(&[("x-usage-tokens", usage)]));
        m.settle(&config, "w1-7", &store, 0)
    };
    // 600 used of 100 reserved: 500 more, no line to the bridge.
    let s = settle("600");
    assert_eq!(
        (s.line, s.settled_locally, s.borrowed_locally),
        (None, 1, 0)
    );
    let left = |store: &FakeShared| local::admit(store, &plan, &names, options, 0).unwrap()[0];
    let after = left(&store);
    assert_eq!((after.allowed, after.remaining), (true, 300));
    // 1000 more used than the 100 reserved: 300 left after that reservation, 700 owed,
    // but this meter's debt stops at 500.
    let s = settle("1100");
    assert_eq!((s.settled_locally, s.borrowed_locally), (1, 500));
    let owing = left(&store);
    // 600 tokens short of the next reservation of 100, at 1000 a minute.
    assert_eq!((owing.allowed, owing.wait_ms), (false, 36_000));
}
