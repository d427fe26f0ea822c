//! The plugin configuration through `proxy_on_configure`: accepted, or refused with a log
//! line naming the field.

use crate::common::{wasm, EXAMPLE};
use wasmtime_harness::{Host, LogLevel};

#[test]
fn the_example_is_accepted_and_logged() {
    let (host, accepted) = Host::boot(wasm(), EXAMPLE).unwrap();
    assert!(accepted);
    assert!(
        host.log_text().contains("configured 4 rule(s)"),
        "{}",
        host.log_text()
    );
}

#[test]
fn bad_configs_are_refused_naming_the_field() {
    let cases = [
        (
            r#"{"backend": {"cluster": ""}, "rules": [{"name": "r", "limit": {"requests": 1, "per": "1s"}}]}"#,
            "backend.cluster",
        ),
        (
            r#"{"backend": {"cluster": "b", "timeout_ms": 0}, "rules": [{"name": "r", "limit": {"requests": 1, "per": "1s"}}]}"#,
            "backend.timeout_ms",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "rules": [{"name": "r", "limit": {"requests": 1, "per": "1 fortnight"}}]}"#,
            "rules[0].limit.per",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "rules": [{"name": "r", "key": ["who"], "limit": {"requests": 1, "per": "1s"}}]}"#,
            "rules[0].key[0]",
        ),
        (
            r#"{"backend": {"cluster": "b"}, "identity": {"x": {"source": "xff", "trusted_hops": 0}}, "rules": [{"name": "r", "limit": {"requests": 1, "per": "1s"}}]}"#,
            "identity.x.trusted_hops",
        ),
        (r#"{"backend": {"cluster": "b"}, "rules": []}"#, "rules"),
        (
            r#"{"backend": {"cluster": "b"}, "rules": [{"name": "r", "limt": {}}]}"#,
            "rules[0]",
        ),
        ("not json", "config"),
        ("", "config"),
    ];
    for (config, field) in cases {
        let (host, accepted) = Host::boot(wasm(), config).unwrap();
        assert!(!accepted, "accepted: {config}");
        let error = host
            .state()
            .logs
            .iter()
            .find(|l| l.level == LogLevel::Error)
            .unwrap_or_else(|| panic!("no error logged for {config}"));
        assert!(
            error
                .message
                .contains(&format!("invalid plugin configuration: {field}")),
            "{config}: {}",
            error.message
        );
    }
}

#[test]
fn a_refused_reconfiguration_keeps_the_previous_config() {
    let (mut host, accepted) = Host::boot(wasm(), EXAMPLE).unwrap();
    assert!(accepted);
    assert!(!host.configure(b"{}").unwrap());
    let (_, action) = host.request("GET", "/anything", &[]).unwrap();
    // The global rule of the first config still applies: the request waits on its check,
    // sent on the stream.
    assert_eq!(action, wasmtime_harness::Action::Pause);
    let sent = host.grpc_streams()[0].messages_text();
    assert!(sent[0].starts_with("1\nrl:global,"), "{sent:?}");
}
