//! One request's check from its rules to its verdict: the line it sends, the rule its
//! response shows, and the refusals that need no check (a repeated or a missing identity).

use super::*;
use crate::fakes::{
    asks, example, finish, header, host, refused, shown_headers, started, FakeProxy, FakeRequest,
    EXAMPLE,
};

#[test]
fn one_callout_carries_every_applicable_rule() {
    let (_, _, body) = started(&example("closed"), &host());
    assert_eq!(
        body,
        "rl:per-user:alice,100,1,600,1 rl:search-per-ip:198.51.100.4,10,1,6000,1 rl:global,50000,50,1,1\n"
    );
}

#[test]
fn no_applicable_rule_means_no_callout() {
    let c = Config::parse(
        br#"{"backend": {"cluster": "b"}, "identity": {"u": {"header": "x-u"}},
            "rules": [{"name": "r", "key": ["u"], "limit": {"requests": 1, "per": "1s"}}]}"#,
    )
    .unwrap();
    let mut host = host();
    host.req = FakeRequest::default();
    assert_eq!(
        Admission::default().start(&c, &mut Worker::new(&c), &host),
        Start::Skip
    );
}

#[test]
fn allowed_request_shows_the_rule_with_fewest_tokens_left() {
    let c = example("closed");
    let (admission, verdict) = finish(
        &c,
        Some(200),
        b"1700000000000 1,97,1800,0 1,3,42000,0 1,49999,1,0\n",
    );
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(admission.outcome, Some(Outcome::Allowed));
    assert_eq!(
        shown_headers(&admission),
        vec![
            ("x-ratelimit-limit", "10".to_string()),
            ("x-ratelimit-remaining", "3".to_string()),
            ("x-ratelimit-reset", "1700000042".to_string()),
        ]
    );
}

#[test]
fn remaining_ties_go_to_the_smaller_bucket() {
    let (admission, verdict) = finish(
        &example("closed"),
        Some(200),
        b"1700000000000 1,5,1,0 1,5,1,0 1,9,1,0\n",
    );
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&admission)[0].1, "10");
}

#[test]
fn a_rule_in_shadow_mode_is_never_shown() {
    let json = EXAMPLE.replace(
        r#"{"name": "search-per-ip", "key": ["ip"],"#,
        r#"{"name": "search-per-ip", "key": ["ip"], "mode": "shadow","#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    // The shadow rule lacked the cost: it has the fewest tokens, yet per-user is shown.
    let (admission, verdict) = finish(&c, Some(200), b"1 1,97,1800,0 1,0,60000,6000 1,49999,1,0\n");
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&admission)[0].1, "100");
    assert_eq!(shown_headers(&admission)[1].1, "97");

    // With every rule in shadow mode the response shows nothing.
    let all_shadow = Config::parse(
        EXAMPLE
            .replace(r#""rules""#, r#""mode": "shadow", "rules""#)
            .as_bytes(),
    )
    .unwrap();
    let (admission, verdict) = finish(&all_shadow, Some(200), b"1 1,0,1,5 1,0,1,5 1,0,1,5\n");
    assert_eq!(verdict, Verdict::Resume);
    assert!(
        shown_headers(&admission).is_empty(),
        "{:?}",
        shown_headers(&admission)
    );
}

#[test]
fn denial_shows_the_denying_rule_with_the_longest_wait() {
    // Alice has tokens left; the IP rule and the global rule deny, the IP one for longer.
    let (admission, verdict) = finish(
        &example("closed"),
        Some(200),
        b"1700000000000 1,50,30000,0 0,0,60000,6000 0,0,20,20\n",
    );
    let Verdict::Reply(r) = verdict else {
        panic!("not denied")
    };
    assert_eq!(r.status, 429);
    assert_eq!(header(&r, "x-ratelimit-limit"), "10");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "x-ratelimit-reset"), "1700000060");
    assert_eq!(header(&r, "retry-after"), "6");
    assert!(r
        .body
        .contains("rate limit of 10 requests per minute. Try again in 6 seconds."));
    assert!(shown_headers(&admission).is_empty());
    assert_eq!(admission.outcome, Some(Outcome::Denied));
}

#[test]
fn headers_on_allowed_responses_can_be_turned_off() {
    let json = EXAMPLE.replace(
        r#""key_prefix": "rl","#,
        r#""key_prefix": "rl", "headers": {"on_allowed": false},"#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let (admission, verdict) = finish(&c, Some(200), b"1 1,1,1,0 1,1,1,0 1,1,1,0");
    assert_eq!(verdict, Verdict::Resume);
    assert!(shown_headers(&admission).is_empty());
}

#[test]
fn extreme_numbers_from_the_bridge_do_not_overflow() {
    let max = u64::MAX;
    let allowed = format!("{max} 1,{max},{max},0 1,{max},{max},0 1,{max},{max},0\n");
    let (admission, verdict) = finish(&example("closed"), Some(200), allowed.as_bytes());
    assert_eq!(verdict, Verdict::Resume);
    assert_eq!(shown_headers(&admission)[2].1, (max / 1000 + 1).to_string());
    let denied = format!("{max} 0,0,{max},{max} 1,1,1,0 1,1,1,0\n");
    let (_, verdict) = finish(&example("closed"), Some(200), denied.as_bytes());
    let Verdict::Reply(r) = verdict else {
        panic!("not denied")
    };
    assert_eq!(header(&r, "retry-after"), (max / 1000 + 1).to_string());
}

#[test]
fn a_repeated_identity_header_is_refused_without_a_check() {
    let c = example("open");
    let mut host = host();
    host.req = host.req.twice("x-user-id");
    let mut worker = Worker::new(&c);
    let (admission, r) = refused(&c, &mut worker, &host);
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("x-user-id header appears more than once"),
        "{}",
        r.body
    );
    assert_eq!(admission.outcome, Some(Outcome::Rejected));
    // A repeated header no rule reads changes nothing.
    host.req = self::host().req.twice("x-unrelated");
    assert!(asks(&c, &mut worker, &host));
}

#[test]
fn a_request_lacking_a_required_identity_is_refused_without_a_check_and_counted() {
    let json = EXAMPLE.replace(
        r#""api_key": {"header": "x-api-key"}"#,
        r#""api_key": {"header": "x-api-key", "missing": "deny"}"#,
    );
    assert_ne!(json, EXAMPLE, "the example's api_key identity moved");
    let c = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let mut worker = Worker::new(&c);
    let (admission, r) = refused(&c, &mut worker, &host);
    assert_eq!(r.status, 429);
    assert!(
        !r.headers.iter().any(|(name, _)| *name == "retry-after"),
        "{:?}",
        r.headers
    );
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["error"], "Rate limit key missing");
    assert_eq!(
        body["message"],
        "This request lacks the x-api-key header, which the rate limit \"uploads\" needs to count it."
    );
    assert_eq!(admission.outcome, Some(Outcome::Missing));
    let uploads = c.rules.iter().position(|r| r.name == "uploads").unwrap();
    assert_eq!(worker.rule_counts.drain(), [(uploads, Counter::Missing, 1)]);
    // With the key, it is checked as before.
    let keyed = FakeProxy {
        req: self::host().req.with("x-api-key", "k1"),
        ..self::host()
    };
    assert!(asks(&c, &mut worker, &keyed));
}
