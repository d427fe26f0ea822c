use super::*;
use crate::config::tests::EXAMPLE;
use crate::identity::tests::FakeRequest;

fn example(failure_mode: &str) -> Config {
    let json = EXAMPLE.replace(
        r#""failure_mode": "closed""#,
        &format!(r#""failure_mode": "{failure_mode}""#),
    );
    Config::parse(json.as_bytes()).unwrap()
}

fn started(config: &Config) -> (Check, String) {
    let req = FakeRequest::default()
        .with(":method", "GET")
        .with(":path", "/api/search")
        .with("x-user-id", "alice")
        .peer_at("198.51.100.4:1");
    let mut check = Check::default();
    let body = check.start(config, &req).unwrap();
    (check, body)
}

fn header<'a>(reply: &'a LocalReply, name: &str) -> &'a str {
    reply
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

#[test]
fn one_callout_carries_every_applicable_rule() {
    let (_, body) = started(&example("closed"));
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
    assert_eq!(Check::default().start(&c, &FakeRequest::default()), None);
}

#[test]
fn allowed_request_shows_the_rule_with_fewest_tokens_left() {
    let c = example("closed");
    let (mut check, _) = started(&c);
    let reply = b"1700000000000 1,97,1800,0 1,3,42000,0 1,49999,1,0\n";
    assert_eq!(check.finish(&c, Some(200), reply), Verdict::Resume);
    assert_eq!(
        check.response_headers,
        vec![
            ("x-ratelimit-limit", "10".to_string()),
            ("x-ratelimit-remaining", "3".to_string()),
            ("x-ratelimit-reset", "1700000042".to_string()),
        ]
    );
}

#[test]
fn remaining_ties_go_to_the_smaller_bucket() {
    let c = example("closed");
    let (mut check, _) = started(&c);
    let reply = b"1700000000000 1,5,1,0 1,5,1,0 1,9,1,0\n";
    assert_eq!(check.finish(&c, Some(200), reply), Verdict::Resume);
    assert_eq!(check.response_headers[0].1, "10");
}

#[test]
fn denial_shows_the_denying_rule_with_the_longest_wait() {
    let c = example("closed");
    let (mut check, _) = started(&c);
    // Alice has tokens left; the IP rule and the global rule deny, the IP one for longer.
    let reply = b"1700000000000 1,50,30000,0 0,0,60000,6000 0,0,20,20\n";
    let Verdict::Reply(r) = check.finish(&c, Some(200), reply) else {
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
    assert!(check.response_headers.is_empty());
}

#[test]
fn headers_on_allowed_responses_can_be_turned_off() {
    let json = EXAMPLE.replace(
        r#""key_prefix": "rl","#,
        r#""key_prefix": "rl", "headers": {"on_allowed": false},"#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let (mut check, _) = started(&c);
    assert_eq!(
        check.finish(&c, Some(200), b"1 1,1,1,0 1,1,1,0 1,1,1,0"),
        Verdict::Resume
    );
    assert!(check.response_headers.is_empty());
}

#[test]
fn failures_follow_the_failure_mode() {
    let failures: &[(Option<u32>, &[u8])] = &[
        (None, b""),
        (Some(503), b"upstream connect error"),
        (Some(200), b"garbage"),
        (Some(200), b"1700000000000 1,97,1800,0"),
        (Some(200), b"! redis unavailable\n"),
    ];
    for &(status, body) in failures {
        let closed = example("closed");
        let (mut check, _) = started(&closed);
        let Verdict::Reply(r) = check.finish(&closed, status, body) else {
            panic!("closed let it through")
        };
        assert_eq!(r.status, 503);
        assert_eq!(header(&r, "retry-after"), "1");

        let open = example("open");
        let (mut check, _) = started(&open);
        assert_eq!(check.finish(&open, status, body), Verdict::Resume);
        assert!(check.response_headers.is_empty());
    }
}
