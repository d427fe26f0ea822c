//! Rules keyed on a field of the request's JSON body (`{"body": "model"}`): the request is
//! held for its body only when such a rule may apply, then planned anew with the value the
//! upstream's parser reads there; a body it may read otherwise refuses the request rather
//! than exempting it.

use super::*;
use crate::decision::admission::Verdict;
use crate::decision::response::LocalReply;
use crate::fakes::{self, FakeProxy, FakeRequest};
use ratelimit_config::loading::{load, Build};

/// `per-model` (keyed on the user and the model, a tier per model, reserving `max_tokens`)
/// on `/v1/chat/completions`, and `per-user` beside it on every path.
fn config(missing: &str) -> Config {
    let json = format!(
        r#"{{"backend": {{"cluster": "b"}},
        "identity": {{"user": {{"header": "x-user-id"}},
                      "model": {{"body": "model", "trusted": true, "missing": "{missing}"}}}},
        "rules": [
          {{"name": "per-model", "key": ["user", "model"], "limit": {{"requests": 1000, "per": "1m"}},
           "match": {{"path": "/v1/chat/completions"}},
           "tier_identity": "model", "tiers": {{"gpt-4o": {{"requests": 100, "per": "1m"}}}},
           "meter": {{"usage": "openai-chat",
                      "reserve": {{"body": ["max_tokens"], "default": 10, "max": 50}}}}}},
          {{"name": "per-user", "key": ["user"], "limit": {{"requests": 10, "per": "1s"}}}}
        ]}}"#
    );
    load(json.as_bytes(), Build::Bridge).unwrap()
}

fn request(path: &str, headers: &[(&str, &str)]) -> FakeProxy {
    let mut req = FakeRequest::default()
        .with(":method", "POST")
        .with(":path", path)
        .with("x-user-id", "alice");
    for (name, value) in headers {
        req = req.with(name, value);
    }
    FakeProxy {
        req,
        ..fakes::host()
    }
}

/// Each planned rule's (name, key, burst, cost) once `body` has ended, or the reply that
/// refused the request.
fn planned(
    config: &Config,
    host: &FakeProxy,
    body: &str,
) -> Result<Vec<(String, String, u64, u64)>, LocalReply> {
    let mut worker = Worker::new(config);
    let mut admission = Admission::default();
    assert_eq!(admission.start(config, &mut worker, host), Start::ReadBody);
    for chunk in body.as_bytes().chunks(7) {
        admission.request_body(chunk);
    }
    match admission.body_ended(config, &mut worker, &fakes::headers_gone()) {
        Start::Decided(Verdict::Reply(reply)) => return Err(reply),
        Start::Ask(_) | Start::Skip => {}
        other => panic!("{other:?}"),
    }
    let name = |p: &PlannedRule| config.rules[p.rule].name.clone();
    Ok(admission
        .planned
        .iter()
        .map(|p| (name(p), p.key.clone(), p.limit.burst, p.cost))
        .collect())
}

fn chat(body: &str) -> Result<Vec<(String, String, u64, u64)>, LocalReply> {
    let config = config("skip");
    planned(&config, &request("/v1/chat/completions", &[]), body)
}

#[test]
fn each_model_has_its_own_bucket_and_its_tier() {
    let dear = chat(r#"{"model": "gpt-4o", "max_tokens": 30, "messages": []}"#).unwrap();
    let cheap = chat(r#"{"messages": [{"model": "x"}], "model": "gpt-4o-mini"}"#).unwrap();
    assert_eq!(dear[0].0, "per-model");
    assert!(dear[0].1.ends_with(":alice:gpt-4o"), "{}", dear[0].1);
    assert!(cheap[0].1.ends_with(":alice:gpt-4o-mini"), "{}", cheap[0].1);
    assert_eq!(
        (dear[0].2, dear[0].3),
        (100, 30),
        "gpt-4o's tier, the body's max_tokens"
    );
    assert_eq!(
        (cheap[0].2, cheap[0].3),
        (1000, 10),
        "the rule's limit, its default"
    );
    assert_eq!(dear[1].0, "per-user");
    assert_eq!(dear[1].1, cheap[1].1);
    // Escapes decode to the model the upstream reads: the same bucket.
    let escaped = chat(r#"{"model": "gpt\u002d4o"}"#).unwrap();
    assert_eq!(escaped[0].1, dear[0].1);
}

#[test]
fn a_body_without_the_model_is_a_missing_identity() {
    for body in [
        "",
        "{}",
        r#"{"model": null}"#,
        r#"{"model": ""}"#,
        "model=gpt-4o",
        "[1]",
    ] {
        let names: Vec<String> = chat(body).unwrap().into_iter().map(|p| p.0).collect();
        assert_eq!(names, ["per-user"], "{body}");
    }
    let config = config("deny");
    let refused = planned(&config, &request("/v1/chat/completions", &[]), "{}").unwrap_err();
    assert_eq!(refused.status, 429);
    assert!(
        refused
            .body
            .contains(r#"the field \"model\" of its JSON body"#),
        "{}",
        refused.body
    );
}

#[test]
fn a_model_the_upstream_may_read_otherwise_refuses_the_request() {
    for (body, problem) in [
        (
            r#"{"model": "gpt-4o-mini", "model": "gpt-4o"}"#,
            "appears more than once",
        ),
        (
            r#"{"model": "gpt-4o", "temperature": NaN}"#,
            "cannot be read",
        ),
        (r#"{"model": "gpt-4o"} {"model": "x"}"#, "cannot be read"),
        (r#"{"model": "gpt-4o""#, "cannot be read"),
        (r#"{"model": 4}"#, "something other than a string"),
        (r#"{"model": "caf\u00e9"}"#, "something other than a string"),
    ] {
        let reply = chat(body).unwrap_err();
        assert_eq!(reply.status, 400, "{body}");
        assert!(reply.body.contains(problem), "{body}: {}", reply.body);
        assert!(
            reply.body.contains("field \\\"model\\\" of its JSON body"),
            "{}",
            reply.body
        );
    }
    let config = config("skip");
    let gzip = request("/v1/chat/completions", &[("content-encoding", "gzip")]);
    let reply = planned(&config, &gzip, r#"{"model": "gpt-4o"}"#).unwrap_err();
    assert!(reply.body.contains("compressed"), "{}", reply.body);
}

#[test]
fn only_a_request_a_body_keyed_rule_may_apply_to_waits_for_its_body() {
    let config = config("skip");
    let mut admission = Admission::default();
    let elsewhere = request("/v1/embeddings", &[]);
    let start = admission.start(&config, &mut Worker::new(&config), &elsewhere);
    assert!(matches!(start, Start::Ask(_)), "{start:?}");
    // One without a body is planned at once, as one without the model.
    let mut worker = Worker::new(&config);
    let mut admission = Admission::default();
    let host = request("/v1/chat/completions", &[]);
    assert_eq!(
        admission.start(&config, &mut worker, &host),
        Start::ReadBody
    );
    let ended = admission.body_ended(&config, &mut worker, &fakes::headers_gone());
    assert!(matches!(ended, Start::Ask(_)));
    assert_eq!(admission.planned.len(), 1);
}
