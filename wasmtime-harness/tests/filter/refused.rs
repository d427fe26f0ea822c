//! A host may answer any status to any call: a local reply after the stream is gone, a
//! call it does not implement, a metric it will not define. The filter must go on deciding
//! what it can and never trap, since a trap kills the VM and every request of its worker.

use crate::common::{bridge, http, EXAMPLE, NOW_MS};
use std::time::Duration;
use wasmtime_harness::{HarnessError, Host, HostState, Status};

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

/// What the filter calls besides on the gRPC stream transport (its default), with a wake
/// queue for the root.
const STREAM_CALLS: &[&str] = &[
    "proxy_grpc_send",
    "proxy_grpc_close",
    "proxy_register_shared_queue",
    "proxy_enqueue_shared_queue",
    "proxy_dequeue_shared_queue",
];

/// An identity header that comes twice: refused with a 400, no check.
const TWICE: [(&str, &str); 2] = [("x-user-id", "alice"), ("x-user-id", "mallory")];

/// A trap fails the path; any other error is the harness refusing a step the filter's
/// earlier answer made moot (a response to a request it replied to itself, say).
fn no_trap<T>(result: Result<T, HarnessError>) -> Result<(), String> {
    match result.err().and_then(|e| e.trap_text()) {
        Some(trap) => Err(trap),
        None => Ok(()),
    }
}

/// The upstream's response to request `id`, unless the filter answered it itself.
fn respond(host: &mut Host, id: u32) -> Result<(), String> {
    if host
        .stream(id)
        .map_err(|e| e.to_string())?
        .local_reply()
        .is_none()
    {
        no_trap(host.response_headers(id, &[(":status", "200")], true))?;
    }
    Ok(())
}

/// The example's rules over one HTTP callout per check, failing over to local limits.
fn http_config() -> String {
    http(&stream_config())
}

/// The same on the gRPC stream, with group commit.
fn stream_config() -> String {
    EXAMPLE.replace(r#""failure_mode": "closed""#, r#""failure_mode": "local""#)
}

/// Every kind of step the filter takes on a request: configured again, a check allowed
/// (with response headers), one denied, one whose callout fails (local limits on shared
/// data), a repeated identity (400), and a tick. Any trap is returned.
fn through_every_path(host: &mut Host) -> Result<(), String> {
    no_trap(host.configure(http_config().as_bytes()))?;
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
        no_trap(answered)?;
        respond(host, id)?;
    }
    no_trap(host.request("GET", "/api/search", &TWICE))?;
    host.tick().map_err(|e| e.to_string())
}

/// On the stream: configured again, a check allowed and one denied (each answered on the
/// stream if it was sent, whatever rules it carries), the stream closed by the bridge and
/// reopened on the ticks of the next six seconds, and a repeated identity. Returns the
/// checks answered on the stream, or any trap.
fn through_the_stream(host: &mut Host) -> Result<usize, String> {
    no_trap(host.configure(stream_config().as_bytes()))?;
    // What is still out on the stream times out (an earlier check nobody answered).
    host.advance(Duration::from_millis(100))
        .map_err(|e| e.to_string())?;
    let headers = [("x-user-id", "alice")];
    let mut answered = 0;
    for rule in ["1,9,600,0", "0,0,6000,4200"] {
        let (id, message) = host
            .request_on_stream("GET", "/api/search", &headers)
            .map_err(|e| e.to_string())?;
        if let Some((token, message)) = message {
            // The exchange's id, then its one check: the same result for each rule.
            let text = String::from_utf8_lossy(&message);
            let mut lines = text.lines();
            let exchange = lines.next().unwrap_or_default();
            let rules = lines.next().unwrap_or_default().split(' ').count();
            let results = vec![rule; rules].join(" ");
            let reply = format!("{exchange}\n{NOW_MS} {results}\n");
            no_trap(host.grpc_message(token, reply.as_bytes()))?;
            answered += 1;
        }
        respond(host, id)?;
    }
    if let Some(token) = host.grpc_streams().last().map(|s| s.token) {
        let closed = host.grpc_remote_close(token, 14, "unavailable");
        no_trap(closed)?;
    }
    // Past the longest backoff: the stream reopens on a tick.
    host.advance(Duration::from_secs(6))
        .map_err(|e| e.to_string())?;
    no_trap(host.request("GET", "/api/search", &TWICE))?;
    Ok(answered)
}

/// A VM configured with `config`, whose host then answers `call` with `status`.
fn refusing(config: &str, call: &str, status: Status) -> Host {
    let mut host = Host::with_state(crate::common::wasm(), HostState::default()).unwrap();
    assert!(host.start(b"").unwrap());
    assert!(host.configure(config.as_bytes()).unwrap());
    host.state_mut().refused.insert(call.to_string(), status);
    host
}

#[test]
fn a_host_refusing_any_call_on_the_stream_never_traps_the_filter() {
    for &call in CALLS.iter().chain(STREAM_CALLS) {
        let mut host = refusing(&stream_config(), call, Status::Unimplemented);
        if let Err(trap) = through_the_stream(&mut host) {
            panic!("{call} refused: {trap}");
        }
        host.state_mut().refused.clear();
        let answered =
            through_the_stream(&mut host).unwrap_or_else(|e| panic!("after {call}: {e}"));
        assert_eq!(answered, 2, "after {call}: both checks went on the stream");
    }
}

#[test]
fn a_host_refusing_any_call_never_traps_the_filter() {
    for &call in CALLS {
        let mut host = refusing(&http_config(), call, Status::Unimplemented);
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
    let local_reply = "proxy_send_local_response";
    let mut host = refusing(&http_config(), local_reply, Status::InternalFailure);
    let (id, _) = host.request("GET", "/api/search", &TWICE).unwrap();
    assert!(host.stream(id).unwrap().local_reply().is_none());
    assert!(
        host.log_text().contains("local reply failed"),
        "{}",
        host.log_text()
    );
    host.state_mut().refused.clear();
    let (id, _) = host.request("GET", "/api/search", &TWICE).unwrap();
    assert_eq!(host.stream(id).unwrap().local_reply().unwrap().status, 400);
}
