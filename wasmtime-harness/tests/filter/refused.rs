//! A host may answer any status to any call: a local reply after the stream is gone, a
//! call it does not implement, a metric it will not define. The filter must go on deciding
//! what it can and never trap, since a trap kills the VM and every request of its worker.

use crate::common::{bridge, http, EXAMPLE, NOW_MS};
use wasmtime_harness::{Host, HostState, Status};

/// The host calls the filter makes on the path below, each refused in turn. Not those
/// the SDK makes for it: `proxy_http_call` and `proxy_grpc_stream` (the SDK must learn
/// their token to route the answers; its wrappers handle what Envoy answers, see
/// `failures.rs` for a refused dispatch), and `proxy_set_effective_context` as the SDK's
/// dispatcher calls it before every callout and gRPC callback, unwrapping the status
/// (Envoy answers Ok for the context it is calling back); the filter's own calls of it
/// handle every status, through `abi`, like the rest.
const CALLS: &[&str] = &[
    "proxy_get_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_add_header_map_value",
    "proxy_get_property",
    "proxy_get_buffer_bytes",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_continue_stream",
    "proxy_send_local_response",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_define_metric",
    "proxy_increment_metric",
];

/// The example's rules over one HTTP callout per check, failing over to local limits.
fn config() -> String {
    http(EXAMPLE).replace(r#""failure_mode": "closed""#, r#""failure_mode": "local""#)
}

/// Every kind of step the filter takes on a request: configured again, a check allowed
/// (with response headers), one denied, one whose callout fails (local limits on shared
/// data), a repeated identity (400), and a tick. Any trap is returned.
fn through_every_path(host: &mut Host) -> Result<(), String> {
    let trap = |e: wasmtime_harness::HarnessError| e.trap_text();
    if let Some(t) = host.configure(config().as_bytes()).err().and_then(trap) {
        return Err(t);
    }
    let headers = [("x-user-id", "alice")];
    for answer in [
        Some(format!("{NOW_MS} 1,99,600,0 1,9,6000,0 1,49999,1,0")),
        Some(format!("{NOW_MS} 1,99,600,0 0,0,6000,4200 1,49999,1,0")),
        None,
    ] {
        let (id, _) = host
            .request("GET", "/api/search", &headers)
            .map_err(|e| e.to_string())?;
        let token = host.callout_of(id).map(|c| c.token);
        let answered = match (token, &answer) {
            (Some(token), Some(line)) => host.answer(token, bridge(line)),
            (Some(token), None) => host.fail_callout(token),
            (None, _) => Ok(()),
        };
        if let Some(t) = answered.err().and_then(trap) {
            return Err(t);
        }
        let replied = host.stream(id).map_err(|e| e.to_string())?.local_reply();
        if replied.is_none() {
            let response = host.response_headers(id, &[(":status", "200")], true);
            if let Some(t) = response.err().and_then(trap) {
                return Err(t);
            }
        }
    }
    let twice = [("x-user-id", "alice"), ("x-user-id", "mallory")];
    if let Some(t) = host
        .request("GET", "/api/search", &twice)
        .err()
        .and_then(trap)
    {
        return Err(t);
    }
    host.tick().map_err(|e| e.to_string())
}

#[test]
fn a_host_refusing_any_call_never_traps_the_filter() {
    for &call in CALLS {
        let state = HostState::default();
        let mut host = Host::with_state(crate::common::wasm(), state).unwrap();
        assert!(host.start(b"").unwrap());
        assert!(host.configure(config().as_bytes()).unwrap());
        host.state_mut()
            .refused
            .insert(call.to_string(), Status::Unimplemented);
        if let Err(trap) = through_every_path(&mut host) {
            panic!("{call} refused: {trap}");
        }
        // Served again, the same VM goes on.
        host.state_mut().refused.clear();
        through_every_path(&mut host).unwrap_or_else(|e| panic!("after {call}: {e}"));
    }
}

#[test]
fn refusing_a_call_is_what_the_test_above_sees() {
    // The harness's refusal reaches the guest: a refused local reply leaves the request
    // paused without one, where the served call answers it.
    let mut host = Host::with_state(crate::common::wasm(), HostState::default()).unwrap();
    assert!(host.start(b"").unwrap());
    assert!(host.configure(config().as_bytes()).unwrap());
    let twice = [("x-user-id", "alice"), ("x-user-id", "mallory")];
    host.state_mut()
        .refused
        .insert("proxy_send_local_response".into(), Status::InternalFailure);
    let (id, _) = host.request("GET", "/api/search", &twice).unwrap();
    assert!(host.stream(id).unwrap().local_reply().is_none());
    assert!(
        host.log_text().contains("local reply failed"),
        "{}",
        host.log_text()
    );
    host.state_mut().refused.clear();
    let (id, _) = host.request("GET", "/api/search", &twice).unwrap();
    assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 400);
}
