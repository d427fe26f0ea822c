//! The harness itself behaving like Envoy where the SDK depends on it, shown through the
//! real filter: header maps, statuses, buffers, properties, lifecycle, fuel.

use crate::common::{boot, bridge, paused, EXAMPLE, NOW_MS};
use wasmtime_harness::abi::{decode_pairs, encode_pairs};
use wasmtime_harness::{pairs, Action, LogLevel};

#[test]
fn header_maps_cross_the_abi_in_envoys_layout() {
    // The SDK serializes the callout's headers and the local reply's headers; the harness
    // decodes both. A byte-exact round trip of the same layout proves both directions.
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/x", &[]);
    let callout = host.callout_of(id).unwrap().clone();
    assert_eq!(
        decode_pairs(&encode_pairs(&callout.headers)).unwrap(),
        callout.headers
    );
    assert_eq!(
        callout.headers,
        pairs(&[
            (":method", "POST"),
            (":path", "/v1/check"),
            (":authority", "ratelimit_bridge"),
            ("content-type", "text/plain")
        ])
    );
    host.answer(token, bridge(&format!("{NOW_MS} 0,0,1000,1000")))
        .unwrap();
    let reply = host.stream(id).unwrap().local_reply().unwrap().clone();
    let names: Vec<String> = reply
        .headers
        .iter()
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
            "content-type"
        ]
    );
}

#[test]
fn header_names_are_matched_case_insensitively_and_a_repeated_identity_is_refused() {
    let config = crate::common::one_rule(r#"{"header": "x-user-id"}"#, "closed");
    let mut host = boot(&config);
    let id = host.new_stream().unwrap();
    // Envoy lower-cases names: X-User-Id is the identity header.
    let headers = pairs(&[(":path", "/"), ("X-User-Id", "first")]);
    assert_eq!(
        host.request_headers_raw(id, headers, true).unwrap(),
        Action::Pause
    );
    assert_eq!(
        host.callout_of(id).unwrap().body_text(),
        "rl:r:first,10,1,6000,1\n"
    );
    // Envoy's single-value read would give the first of a repeated header; the filter
    // sees both and refuses, whichever spelling each copy has.
    let id = host.new_stream().unwrap();
    let headers = pairs(&[
        (":path", "/"),
        ("X-User-Id", "first"),
        ("x-user-id", "second"),
    ]);
    assert_eq!(
        host.request_headers_raw(id, headers, true).unwrap(),
        Action::Pause
    );
    assert!(host.callout_of(id).is_none());
    assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 400);
}

#[test]
fn missing_headers_are_not_found_not_errors() {
    // The SDK panics on any status but Ok/NotFound: a request with no headers at all must
    // run through every lookup the filter makes without a trap.
    let mut host = boot(EXAMPLE);
    let id = host.new_stream().unwrap();
    assert_eq!(
        host.request_headers_raw(id, Vec::new(), true).unwrap(),
        Action::Pause
    );
    assert_eq!(
        host.callout_of(id).unwrap().body_text(),
        "rl:global,50000,50,1,1\n"
    );
}

#[test]
fn status_codes_reach_the_filter_as_it_expects() {
    let mut host = boot(EXAMPLE);
    for (status, resumed) in [(200, true), (204, false), (429, false), (500, false)] {
        let (id, token) = paused(&mut host, "GET", "/", &[]);
        let mut reply = bridge(&format!("{NOW_MS} 1,1,1,0"));
        reply.headers[0].1 = status.to_string().into_bytes();
        host.answer(token, reply).unwrap();
        assert_eq!(host.stream(id).unwrap().resumed(), resumed, "{status}");
    }
}

#[test]
fn stream_lifecycle_runs_done_log_delete() {
    let mut host = boot(EXAMPLE);
    let (id, token) = paused(&mut host, "GET", "/", &[]);
    host.answer(token, bridge(&format!("{NOW_MS} 1,1,1,0")))
        .unwrap();
    host.response_headers(id, &[(":status", "200")], true)
        .unwrap();
    host.finish_stream(id).unwrap();
    let callbacks: Vec<&str> = host
        .state()
        .fuel
        .iter()
        .filter(|f| f.context_id == id)
        .map(|f| f.callback)
        .collect();
    assert_eq!(
        callbacks,
        [
            "proxy_on_context_create",
            "proxy_on_request_headers",
            "proxy_on_http_call_response",
            "proxy_on_response_headers",
            "proxy_on_done",
            "proxy_on_log",
            "proxy_on_delete"
        ]
    );
    assert!(host.stream(id).unwrap().deleted);
    // The filter logs nothing above info on the happy path.
    assert!(
        host.state().logs.iter().all(|l| l.level <= LogLevel::Info),
        "{}",
        host.log_text()
    );
}

#[test]
fn the_harness_serves_every_import_of_the_filter_but_grpc_calls_and_foreign_calls() {
    let host = wasmtime_harness::Host::new(crate::common::wasm()).unwrap();
    let mut unserved = host.unserved_imports().to_vec();
    unserved.sort();
    assert_eq!(
        unserved,
        ["env.proxy_call_foreign_function", "env.proxy_grpc_call"]
    );
}

/// Fuel of one request through a warmed-up filter (its allocator and maps already grown).
fn request_cost(host: &mut wasmtime_harness::Host, line: &str) -> u64 {
    let mark = host.fuel_mark();
    let (id, token) = paused(host, "GET", "/api/search", &[("x-user-id", "alice")]);
    host.answer(token, bridge(&format!("{NOW_MS} {line}")))
        .unwrap();
    host.response_headers(id, &[(":status", "200")], true)
        .unwrap();
    host.finish_stream(id).unwrap();
    host.fuel_since(mark)
}

const ALLOWED: &str = "1,99,600,0 1,9,6000,0 1,49999,1,0";
const DENIED: &str = "1,99,600,0 0,0,6000,4200 1,49999,1,0";

/// The wasm cost of one request, deterministic: printed for the benchmark notes.
#[test]
fn fuel_of_one_allowed_and_one_denied_request() {
    let measure = || {
        let mut host = boot(EXAMPLE);
        request_cost(&mut host, ALLOWED);
        (
            request_cost(&mut host, ALLOWED),
            request_cost(&mut host, DENIED),
        )
    };
    let (allowed, denied) = measure();
    println!("fuel: allowed request (3 rules) {allowed}, denied request (3 rules) {denied}");
    assert!(allowed > 1_000 && denied > 1_000, "{allowed} {denied}");
    // Deterministic: a fresh VM doing the same work burns exactly the same fuel.
    assert_eq!(measure(), (allowed, denied));
}
