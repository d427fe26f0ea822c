//! Methods as the upstream serves them: `HEAD` is a `GET`, a method in any case is that
//! method, and a method-override header the configuration names is honoured.

use crate::fakes::FakeRequest;
use crate::request::rules::plan;
use ratelimit_config::config::Config;

/// One rule on `methods` (per IP), `extra` at the top level of the configuration.
fn search_on(methods: &str, extra: &str) -> Config {
    let json = format!(
        r#"{{"backend": {{"cluster": "b"}}, "identity": {{"ip": {{"source": "peer"}}}}, {extra}
            "rules": [{{"name": "search", "key": ["ip"], "limit": {{"requests": 1, "per": "1s"}},
                        "match": {{"path_prefix": "/api/search", "methods": {methods}}}}}]}}"#
    );
    Config::parse(json.as_bytes()).unwrap()
}

fn request(method: &str) -> FakeRequest {
    FakeRequest::default()
        .with(":method", method)
        .with(":path", "/api/search")
        .peer_at("198.51.100.4:1")
}

fn limited(config: &Config, req: &FakeRequest) -> bool {
    !plan(config, req, None, |_| {}).unwrap().is_empty()
}

#[test]
fn a_get_rule_covers_head_and_every_spelling_of_get() {
    let c = search_on(r#"["GET"]"#, "");
    for method in ["GET", "HEAD", "get", "Head"] {
        assert!(limited(&c, &request(method)), "{method}");
    }
    for method in ["POST", "OPTIONS", "GETS", ""] {
        assert!(!limited(&c, &request(method)), "{method}");
    }
    // HEAD is a GET, not the other way round.
    let head_only = search_on(r#"["HEAD"]"#, "");
    assert!(limited(&head_only, &request("HEAD")));
    assert!(!limited(&head_only, &request("GET")));
}

#[test]
fn a_method_override_the_configuration_names_is_the_method() {
    let c = search_on(
        r#"["GET"]"#,
        r#""method_override": ["X-HTTP-Method-Override", "x-method"],"#,
    );
    assert_eq!(c.method_override, ["x-http-method-override", "x-method"]);
    let post = || request("POST");
    let honoured = [
        post().with("x-http-method-override", "GET"),
        post().with("x-http-method-override", " get "),
        post().with("x-method", "HEAD"),
        post().with("x-method", "PUT, GET"),
        post().with("x-method", "DELETE").also("x-method", "GET"),
        post()
            .with("x-method", "PUT")
            .also("x-http-method-override", "GET"),
    ];
    for req in &honoured {
        assert!(limited(&c, req), "{:?}", req.headers);
    }
    let not = [
        post(),
        post().with("x-method", "PUT"),
        post().with("x-method", ",, ,"),
        post().with("x-other-override", "GET"),
    ];
    for req in &not {
        assert!(!limited(&c, req), "{:?}", req.headers);
    }
    // Unconfigured, an override header is a header like any other.
    let plain = search_on(r#"["GET"]"#, "");
    assert!(!limited(
        &plain,
        &post().with("x-http-method-override", "GET")
    ));
    // The request's own method still counts: the upstream may ignore the override.
    let posts = search_on(
        r#"["POST"]"#,
        r#""method_override": ["x-http-method-override"],"#,
    );
    assert!(limited(
        &posts,
        &post().with("x-http-method-override", "GET")
    ));
}
