use super::*;
use crate::fakes::{self, FakeProxy};
use ratelimit_config::loading::{load, Build};

/// A rule reserving what the body's `max_tokens` or `max_completion_tokens` asks (or
/// `x-max-tokens`), at most 500, else 100; and a fixed-cost rule beside it.
fn config() -> Config {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"user": {"header": "x-user-id"}},
        "rules": [
          {"name": "tokens", "key": ["user"], "limit": {"requests": 1000, "per": "1m"},
           "meter": {"body": {"usage.total_tokens": 1},
                     "reserve": {"header": "x-max-tokens",
                                 "body": ["max_tokens", "max_completion_tokens"],
                                 "default": 100, "max": 500}}},
          {"name": "plain", "key": ["user"], "limit": {"requests": 10, "per": "1s"}}
        ]}"#;
    load(json.as_bytes(), Build::Bridge).unwrap()
}

/// What the metered rule reserves for a request with `headers` and a body sent in
/// `chunks`, and the fixed rule's cost beside it.
fn reserved(headers: &[(&str, &str)], chunks: &[&str]) -> (u64, u64) {
    let config = config();
    let mut host = fakes::host();
    for (name, value) in headers {
        host.req = host.req.with(name, value);
    }
    let mut worker = Worker::new(&config);
    let mut admission = Admission::default();
    assert_eq!(
        admission.start(&config, &mut worker, &host),
        Start::ReadBody
    );
    for chunk in chunks {
        admission.request_body(chunk.as_bytes());
    }
    let Start::Ask(_) = admission.body_ended(&config, &mut worker, &fakes::headers_gone()) else {
        panic!("the check asks once the body has ended")
    };
    (admission.planned[0].cost, admission.planned[1].cost)
}

#[test]
fn a_body_split_anywhere_reserves_the_largest_of_its_fields_bounded() {
    let body = r#"{"model": "m", "max_tokens": 300, "messages": [{"max_tokens": 9999}],
                   "max_completion_tokens": 250}"#;
    for at in 0..body.len() {
        let (head, tail) = body.split_at(at);
        assert_eq!(reserved(&[], &[head, tail]), (300, 1), "split at {at}");
    }
    assert_eq!(
        reserved(&[], &[r#"{"max_completion_tokens": 450, "max_tokens": 5}"#]).0,
        450
    );
    assert_eq!(
        reserved(&[], &[r#"{"max_tokens": 1000000}"#]).0,
        500,
        "at most max"
    );
}

#[test]
fn a_body_asking_nothing_reserves_the_default_or_what_the_header_asks() {
    for body in [
        "{}",
        " {\"model\": \"m\"}\n",
        r#"{"max_tokens": null}"#,
        r#"{"max_tokens": 0}"#,
        r#"[{"max_tokens": 400}]"#,
        r#"{"messages": [{"max_tokens": 400}]}"#,
    ] {
        assert_eq!(reserved(&[], &[body]).0, 100, "{body:.40}");
        assert_eq!(
            reserved(&[("x-max-tokens", "321")], &[body]).0,
            321,
            "{body:.40}"
        );
    }
    // The header and the body both count: the larger wins, either way.
    assert_eq!(
        reserved(&[("x-max-tokens", "50")], &[r#"{"max_tokens": 70}"#]).0,
        70
    );
    assert_eq!(
        reserved(&[("x-max-tokens", "90")], &[r#"{"max_tokens": 70}"#]).0,
        90
    );
}

#[test]
fn a_body_the_upstream_may_read_otherwise_reserves_the_max() {
    // Each of these the upstream (Python's json, pydantic's lax mode) reads as asking
    // something, or as asking 400 where the filter would read another count.
    for body in [
        "",
        r#"{"max_tokens": "400"}"#,
        r#"{"max_tokens": -400}"#,
        r#"{"max_tokens": 400.5}"#,
        r#"{"max_tokens": 4e2}"#,
        r#"{"max_tokens": 400.0}"#,
        r#"{"max_tokens": true}"#,
        r#"{"max_tokens": 1000000000000000000000000000000}"#,
        r#"{"max_tokens": [400]}"#,
        r#"{"max_tokens": 400, "max_completion_tokens": "x"}"#,
        r#"{"max_tokens": 400, "max_tokens": 20}"#,
        r#"{"max_tokens": 20, "max_tokens": null}"#,
        r#"{"max_tokens": 1, "x": NaN, "max_tokens": 400}"#,
        r#"{"max_tokens": 1, "x": -Infinity}"#,
        "\u{feff}{\"max_tokens\": 400}",
        "{\"max_tokens\": 400} {\"max_tokens\": 1}",
        r#"{"max_tokens": 400,}"#,
        "not json at all",
        &"[".repeat(100_000),
    ] {
        for header in [None, Some("321")] {
            let headers: Vec<(&str, &str)> =
                header.map(|h| ("x-max-tokens", h)).into_iter().collect();
            assert_eq!(reserved(&headers, &[body]).0, 500, "{body:.40} {header:?}");
        }
    }
    // UTF-16, as Python's json detects it.
    let utf16: Vec<u8> = "\u{feff}{\"max_tokens\": 400}"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let config = config();
    let host = fakes::host();
    let mut worker = Worker::new(&config);
    let mut admission = Admission::default();
    assert_eq!(
        admission.start(&config, &mut worker, &host),
        Start::ReadBody
    );
    admission.request_body(&utf16);
    admission.body_ended(&config, &mut worker, &fakes::headers_gone());
    assert_eq!(admission.planned[0].cost, 500);
    // A compressed body cannot be read at all, whatever it holds.
    assert_eq!(
        reserved(&[("content-encoding", "gzip")], &[r#"{"max_tokens": 7}"#]).0,
        500
    );
    assert_eq!(
        reserved(
            &[("content-encoding", "identity")],
            &[r#"{"max_tokens": 7}"#]
        )
        .0,
        7
    );
}

#[test]
fn only_a_rule_reserving_from_the_body_makes_a_request_wait_for_it() {
    let fixed = load(
        br#"{"backend": {"cluster": "b"}, "identity": {"user": {"header": "x-user-id"}},
             "rules": [{"name": "t", "key": ["user"], "limit": {"requests": 9, "per": "1s"},
                        "meter": {"header": "x-u", "reserve": {"header": "x-max", "default": 3}}}]}"#,
        Build::Bridge,
    )
    .unwrap();
    let mut admission = Admission::default();
    let start = admission.start(&fixed, &mut Worker::new(&fixed), &fakes::host());
    assert!(matches!(start, Start::Ask(_)), "{start:?}");
    // A request no rule applies to never waits for its body either.
    let config = config();
    let anonymous = FakeProxy {
        req: fakes::FakeRequest::default().with(":path", "/"),
        ..fakes::host()
    };
    let mut admission = Admission::default();
    let start = admission.start(&config, &mut Worker::new(&config), &anonymous);
    assert_eq!(start, Start::Skip);
}
