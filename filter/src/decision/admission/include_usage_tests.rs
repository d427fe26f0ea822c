//! `meter.include_usage`: a streamed chat completion that does not ask for its usage is
//! made to, by one insertion in the body the host holds; every other body goes on as the
//! client sent it.

use super::*;
use crate::fakes::{self, FakeProxy, FakeRequest};
use ratelimit_config::loading::{load, Build};
use serde_json::Value;

fn config(include_usage: bool) -> Config {
    let json = format!(
        r#"{{"backend": {{"cluster": "b"}},
        "identity": {{"user": {{"header": "x-user-id"}}}},
        "rules": [{{"name": "tokens", "key": ["user"], "limit": {{"requests": 1000, "per": "1m"}},
                    "meter": {{"usage": "openai-chat", "include_usage": {include_usage},
                               "reserve": 100}}}}]}}"#
    );
    load(json.as_bytes(), Build::Bridge).unwrap()
}

/// The body the upstream gets for `body` (with `headers`), and whether its length went.
fn sent(body: &str, headers: &[(&str, &str)]) -> (String, bool) {
    let config = config(true);
    let mut req = FakeRequest::default()
        .with(":method", "POST")
        .with(":path", "/v1/chat/completions")
        .with("x-user-id", "alice")
        .with("content-length", body.len().to_string());
    for (name, value) in headers {
        req = req.with(name, value);
    }
    let host = FakeProxy {
        req,
        ..fakes::host()
    };
    let mut worker = Worker::new(&config);
    let mut admission = Admission::default();
    assert_eq!(
        admission.start(&config, &mut worker, &host),
        Start::ReadBody
    );
    let unframed = host
        .removed
        .borrow()
        .contains(&"content-length".to_string());
    let gone = fakes::headers_gone();
    *gone.body.borrow_mut() = body.as_bytes().to_vec();
    for chunk in body.as_bytes().chunks(5) {
        admission.request_body(chunk);
    }
    assert!(matches!(
        admission.body_ended(&config, &mut worker, &gone),
        Start::Ask(_)
    ));
    let sent = String::from_utf8(gone.body.borrow().clone()).unwrap();
    (sent, unframed)
}

#[test]
fn a_stream_that_does_not_ask_for_its_usage_is_made_to() {
    let body = r#" {"model": "m", "stream": true, "messages": [{"role": "user", "content": "{"}]}"#;
    let (sent, unframed) = sent(body, &[]);
    assert!(unframed, "its length may change: content-length goes");
    let mut got: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(
        got["stream_options"],
        serde_json::json!({"include_usage": true})
    );
    got.as_object_mut().unwrap().remove("stream_options");
    assert_eq!(
        got,
        serde_json::from_str::<Value>(body).unwrap(),
        "nothing else changed"
    );
}

#[test]
fn every_other_body_goes_on_as_the_client_sent_it() {
    for body in [
        r#"{"model": "m", "messages": []}"#,
        r#"{"model": "m", "stream": false}"#,
        r#"{"stream": true, "stream_options": {"include_usage": false}}"#,
        r#"{"stream": true, "stream_options": null, "stream_options": {}}"#,
        r#"{"stream": true, "stream": false}"#,
        r#"{"stream": "true"}"#,
        r#"{"stream": true, "x": NaN}"#,
        r#"{"stream": true} {}"#,
        r#"[{"stream": true}]"#,
        "",
    ] {
        assert_eq!(sent(body, &[]).0, body);
    }
    let gzip = r#"{"stream": true}"#;
    assert_eq!(sent(gzip, &[("content-encoding", "gzip")]).0, gzip);
}

#[test]
fn a_meter_that_does_not_ask_holds_no_body_and_keeps_the_length() {
    let config = config(false);
    let host = FakeProxy {
        req: FakeRequest::default()
            .with("x-user-id", "alice")
            .with("content-length", "9"),
        ..fakes::host()
    };
    let mut admission = Admission::default();
    let start = admission.start(&config, &mut Worker::new(&config), &host);
    assert!(matches!(start, Start::Ask(_)), "{start:?}");
    assert!(host.removed.borrow().is_empty());
}
