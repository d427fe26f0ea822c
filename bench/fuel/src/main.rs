//! `wasm-fuel`: what one request costs inside the wasm, in wasmtime fuel (about one unit
//! per wasm instruction), for `make bench`. Fuel does not depend on the machine or its
//! load, so unlike latencies it is comparable across runs exactly.
//!
//! It drives the real filter through the wasmtime harness: an allowed request (headers,
//! callout, bridge reply, response headers, end of stream), a denied one (ending in the
//! 429), and the same allowed request through the no-op filter as the floor.
//!
//! ```text
//! wasm-fuel dist/ratelimit.wasm target/wasm32-wasip1/release/ratelimit_bench_noop.wasm
//! {"allowed": 123456, "denied": 123456, "noop": 1234, "requests": 10}
//! ```

use std::path::Path;
use std::process::ExitCode;
use wasmtime_harness::{CallResponse, Host, Wasm};

/// One rule keyed by `x-user-id`, as in the bench's configuration 4.
const CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100, "per": "1m"}}]}"#;

/// Requests measured per case; the median is reported (the first ones warm caches up).
const REQUESTS: usize = 11;

/// The bridge's answer to a one-rule check: Redis time, then allowed,remaining,full,wait.
const ALLOWED: &str = "1767225600000 1,99,600,0\n";
const DENIED: &str = "1767225600000 0,0,60000,600\n";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [filter, noop] = args.as_slice() else {
        eprintln!("usage: wasm-fuel <ratelimit.wasm> <noop.wasm>");
        return ExitCode::FAILURE;
    };
    match run(Path::new(filter), Path::new(noop)) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wasm-fuel: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(filter: &Path, noop: &Path) -> Result<String, String> {
    let filter = load(filter)?;
    let allowed = median(&filter, Some(ALLOWED))?;
    let denied = median(&filter, Some(DENIED))?;
    let noop = median(&load(noop)?, None)?;
    Ok(format!(
        r#"{{"allowed": {allowed}, "denied": {denied}, "noop": {noop}, "requests": {REQUESTS}}}"#
    ))
}

/// Compiles a module once (the slow part); each case boots a fresh host from it.
fn load(path: &Path) -> Result<Wasm, String> {
    Wasm::load(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The median fuel of `REQUESTS` requests, each answered with `reply` when it calls out.
fn median(wasm: &Wasm, reply: Option<&str>) -> Result<u64, String> {
    let (mut host, accepted) = Host::boot(wasm, CONFIG).map_err(|e| e.to_string())?;
    if !accepted {
        return Err(format!(
            "the filter refused the configuration:\n{}",
            host.log_text()
        ));
    }
    let mut fuel = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        fuel.push(one_request(&mut host, reply)?);
    }
    fuel.sort_unstable();
    Ok(fuel[REQUESTS / 2])
}

/// Fuel of every callback of one request, from its headers to the end of its stream.
fn one_request(host: &mut Host, reply: Option<&str>) -> Result<u64, String> {
    let mark = host.fuel_mark();
    let headers = [("x-user-id", "alice")];
    let (id, _) = host
        .request("GET", "/api/profile", &headers)
        .map_err(|e| e.to_string())?;
    let token = host.callout_of(id).map(|c| c.token);
    match (token, reply) {
        (Some(token), Some(body)) => host
            .answer(token, CallResponse::new(200, body))
            .map_err(|e| e.to_string())?,
        (None, None) => {}
        (Some(_), None) => return Err("the no-op filter called out".into()),
        (None, Some(_)) => return Err(format!("no callout:\n{}", host.log_text())),
    }
    let replied = host
        .stream(id)
        .map_err(|e| e.to_string())?
        .local_reply()
        .is_some();
    if !replied {
        host.response_headers(id, &[(":status", "200")], true)
            .map_err(|e| e.to_string())?;
    }
    host.finish_stream(id).map_err(|e| e.to_string())?;
    Ok(host.fuel_since(mark))
}
