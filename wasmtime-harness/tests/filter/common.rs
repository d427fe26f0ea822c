//! What every test file shares: the filter compiled once per test binary, configurations,
//! and bridge replies in the callout protocol.

use std::sync::OnceLock;
use wasmtime_harness::{Action, CallResponse, Host, Wasm};

/// The real filter, compiled once; a missing file fails the test with how to build it.
pub fn wasm() -> &'static Wasm {
    static WASM: OnceLock<Result<Wasm, String>> = OnceLock::new();
    match WASM.get_or_init(|| Wasm::load_default().map_err(|e| e.to_string())) {
        Ok(w) => w,
        Err(e) => panic!("{e}"),
    }
}

/// The issue's example: per-user on /api/, search-per-ip on GET /api/search, uploads by
/// api key with cost 5, and a global rule.
pub const EXAMPLE: &str = include_str!("../../../filter/example-config.json");

/// One rule `r` (10 per minute) keyed on one identity `id` defined by `identity`.
pub fn one_rule(identity: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"backend": {{"cluster": "ratelimit_bridge", "timeout_ms": 25}},
            "failure_mode": "{failure_mode}",
            "identity": {{"id": {identity}}},
            "rules": [{{"name": "r", "key": ["id"], "limit": {{"requests": 10, "per": "1m"}}}}]}}"#
    )
}

/// `config` speaking one HTTP callout per check, unless it chooses a transport itself: the
/// suites that test decisions answer each request's callout on its own. `stream.rs` and
/// `group_commit.rs` cover the default (a gRPC stream, group commit).
pub fn http(config: &str) -> String {
    if config.contains(r#""transport""#) {
        return config.to_string();
    }
    config.replacen(
        r#""backend": {"#,
        r#""backend": {"transport": "http", "max_inflight": 0, "#,
        1,
    )
}

/// A host with `http(config)` loaded; fails the test if the plugin refuses it.
pub fn boot(config: &str) -> Host {
    let (host, accepted) = Host::boot(wasm(), &http(config)).unwrap();
    assert!(accepted, "config refused:\n{}", host.log_text());
    host
}

/// The Redis time the bridge replies carry: 2026-01-01T00:00:00Z.
pub const NOW_MS: u64 = 1_767_225_600_000;

/// A 200 from the bridge with `line` as the one check's answer.
pub fn bridge(line: &str) -> CallResponse {
    CallResponse::new(200, format!("{line}\n")).header("content-type", "text/plain")
}

/// Sends a request and returns the stream, the action, and the callout token (asserting
/// the filter paused on a callout).
pub fn paused(host: &mut Host, method: &str, path: &str, headers: &[(&str, &str)]) -> (u32, u32) {
    let (id, action) = host.request(method, path, headers).unwrap();
    assert_eq!(action, Action::Pause, "logs:\n{}", host.log_text());
    let token = host.callout_of(id).expect("a callout").token;
    (id, token)
}
