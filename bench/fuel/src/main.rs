//! `wasm-fuel`: what one request costs inside the wasm, in wasmtime fuel (about one unit
//! per wasm instruction), for `make bench`. Fuel does not depend on the machine or its
//! load, so unlike latencies it is comparable across runs exactly.
//!
//! It drives the real filter through the wasmtime harness with its default transport (the
//! gRPC stream): an allowed request (headers, stream message, bridge reply, response
//! headers, end of stream), a denied one (ending in the 429), one admitted from a lease of
//! a hot global rule (no check), and the same allowed request through the no-op filter as
//! the floor, plain and as the headers floor (only the host calls an allowed response
//! needs). Every response must show the limit, but the plain no-op's. With `--callbacks` it
//! also prints where the fuel
//! of one allowed request goes, callback by callback.
//!
//! ```text
//! wasm-fuel dist/ratelimit.wasm target/wasm32-wasip1/release/ratelimit_bench_noop.wasm
//! {"allowed": 123456, "denied": 123456, "leased": 12345, "noop": 1234, "headers_floor": 1234, "requests": 10}
//! ```

// The streamed response, one definition with the bench's `sse-upstream` (its `//!` says
// why by path).
#[path = "../../src/events.rs"]
mod events;

use events::{chunk, CHUNKS};
use std::path::Path;
use std::process::ExitCode;
use wasmtime_harness::{abi, Host, Wasm};

/// One rule keyed by `x-user-id`, as in the bench's configuration 5; without the deny
/// cache, so that every denied request is the full path (a check and the bridge's answer).
const CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "deny_cache_entries": 0,
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100, "per": "1m"}}]}"#;

/// Bench configuration 9: one client's bucket leasing tokens, here 1,000, which no
/// measured request exhausts.
const LEASED_CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "leased", "key": ["user"], "limit": {"requests": 1000000, "per": "1s"},
             "lease": {"tokens": 1000, "ttl": "1m"}}]}"#;

/// The per-user rule of `CONFIG` with its cost metered from an OpenAI-compatible stream's
/// usage, and the same rule unmetered: the two sides of the metering's cost per chunk.
const METERED_CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "deny_cache_entries": 0,
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100000, "per": "1m"},
             "meter": {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 1},
                       "reserve": 100}}]}"#;
/// The same metered by its usage format (`openai-chat`: four counts where the paths above
/// are two), for what a format costs against dotted paths.
const FORMAT_CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "deny_cache_entries": 0,
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100000, "per": "1m"},
             "meter": {"usage": "openai-chat", "reserve": 100}}]}"#;
const UNMETERED_CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "deny_cache_entries": 0,
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100000, "per": "1m"},
             "cost": 100}]}"#;
/// The format's rule asking streams for their usage (`include_usage`): each streamed
/// request's body is held, read and given `stream_options`.
const ASKING_CONFIG: &str = r#"{"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 25},
  "deny_cache_entries": 0,
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 100000, "per": "1m"},
             "meter": {"usage": "openai-chat", "include_usage": true, "reserve": 100}}]}"#;

/// A streamed chat completion's body as a client sends it (about 1 KB), asking nothing of
/// its usage.
const CHAT_BODY: &str = concat!(
    r#"{"model": "gpt-4o-mini", "stream": true, "temperature": 0.2, "messages": ["#,
    r#"{"role": "system", "content": "You are a careful assistant. Answer briefly, cite "#,
    r#"nothing you cannot check, and say so when you do not know."}, "#,
    r#"{"role": "user", "content": "Our gateway limits each API key to a number of tokens "#,
    r#"a minute per model. A client streams its completions and never asks for usage. "#,
    r#"How does the gateway know what each stream cost, and what does the client see "#,
    r#"differently once it does? Please answer in three short paragraphs, the first on "#,
    r#"what the API reports, the second on what the gateway changes in the request, the "#,
    r#"third on what a client library does with one more chunk at the end of the "#,
    r#"stream, one whose choices are empty and whose usage is set."}]}"#
);

/// The bridge's answer to the streamed requests' checks.
const STREAM_ALLOWED: &str = "1767225600000 1,99900,60,0\n";

/// The no-op filter making only the host calls an allowed response needs (bench/noop-filter).
const HEADERS_FLOOR: &str = r#"{"headers": {"identity": "x-user-id"}}"#;

/// The answer to the check that asks for the lease: granted 1,000.
const GRANTED: &str = "1767225600000 1,998000,2,0,1000\n";

/// The header that shows the client its limit, on allowed and denied responses alike.
const LIMIT: &str = "x-ratelimit-limit";

/// Requests measured per case; the median is reported (the first ones warm caches up).
const REQUESTS: usize = 11;

/// The bridge's answer to a one-rule check: Redis time, then allowed,remaining,full,wait.
const ALLOWED: &str = "1767225600000 1,99,600,0\n";
const DENIED: &str = "1767225600000 0,0,60000,600\n";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let callbacks = args.first().is_some_and(|a| a == "--callbacks");
    if callbacks {
        args.remove(0);
    }
    let [filter, noop] = args.as_slice() else {
        eprintln!("usage: wasm-fuel [--callbacks] <ratelimit.wasm> <noop.wasm>");
        return ExitCode::FAILURE;
    };
    if callbacks {
        return match breakdown(Path::new(filter)) {
            Ok(lines) => {
                println!("{lines}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("wasm-fuel: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
    let allowed = median(&filter, CONFIG, Some(ALLOWED), true)?;
    let denied = median(&filter, CONFIG, Some(DENIED), true)?;
    let leased = leased(&filter)?;
    let noop = load(noop)?;
    let floor = median(&noop, HEADERS_FLOOR, None, true)?;
    let noop = median(&noop, "", None, false)?;
    let unmetered = streamed(&filter, UNMETERED_CONFIG)?;
    let metered = streamed(&filter, METERED_CONFIG)?;
    let format = streamed(&filter, FORMAT_CONFIG)?;
    let sent = with_body(&filter, FORMAT_CONFIG)?;
    let asked = with_body(&filter, ASKING_CONFIG)?;
    Ok(format!(
        r#"{{"allowed": {allowed}, "denied": {denied}, "leased": {leased}, "noop": {noop}, "headers_floor": {floor}, "requests": {REQUESTS}, "stream_chunks": {CHUNKS}, "stream_unmetered": {unmetered}, "stream_metered": {metered}, "stream_metered_format": {format}, "chat_request": {sent}, "chat_request_usage_asked": {asked}, "chat_request_bytes": {}}}"#,
        CHAT_BODY.len()
    ))
}

/// The median fuel of `REQUESTS` streamed chat requests (`CHAT_BODY`) under `config`, from
/// their headers and body to their check's answer: what holding, reading and rewriting a
/// body costs (`include_usage`) against a request checked at its headers.
fn with_body(wasm: &Wasm, config: &str) -> Result<u64, String> {
    let mut host = boot(wasm, config)?;
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "example.com"),
        ("x-user-id", "alice"),
        ("content-type", "application/json"),
    ];
    let mut fuel = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let mark = host.fuel_mark();
        let before = host.grpc_messages_sent();
        let id = host.new_stream().map_err(|e| e.to_string())?;
        host.request_headers(id, &headers, false)
            .map_err(|e| e.to_string())?;
        host.request_body(id, CHAT_BODY.as_bytes(), true)
            .map_err(|e| e.to_string())?;
        if host.grpc_messages_sent() == before {
            return Err(format!("no check sent:\n{}", host.log_text()));
        }
        let last = host.grpc_streams().last();
        let (token, message) = last
            .and_then(|s| Some((s.token, s.messages.last()?.clone())))
            .ok_or("no stream")?;
        host.grpc_message(token, &answer(&message))
            .map_err(|e| e.to_string())?;
        host.finish_stream(id).map_err(|e| e.to_string())?;
        fuel.push(host.fuel_since(mark));
    }
    fuel.sort_unstable();
    Ok(fuel[REQUESTS / 2])
}

/// The median fuel of `REQUESTS` allowed requests under `config` whose responses are
/// `CHUNKS`-chunk event streams, from the request's headers to the stream's end (and, when
/// metered, the settlement's line on the stream).
fn streamed(wasm: &Wasm, config: &str) -> Result<u64, String> {
    let mut host = boot(wasm, config)?;
    let chunks: Vec<String> = (0..CHUNKS).map(chunk).collect();
    let mut fuel = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let mark = host.fuel_mark();
        let (id, message) = host
            .request_on_stream("POST", "/v1/chat/completions", &[("x-user-id", "alice")])
            .map_err(|e| e.to_string())?;
        let Some((token, message)) = message else {
            return Err(format!("no check sent:\n{}", host.log_text()));
        };
        host.grpc_message(token, &answer(&message))
            .map_err(|e| e.to_string())?;
        // The settlement may leave with the body's last chunk or at the stream's end.
        let sent = host.grpc_messages_sent();
        let headers = [(":status", "200"), ("content-type", "text/event-stream")];
        host.response_headers(id, &headers, false)
            .map_err(|e| e.to_string())?;
        for (i, chunk) in chunks.iter().enumerate() {
            host.response_body(id, chunk.as_bytes(), i + 1 == CHUNKS)
                .map_err(|e| e.to_string())?;
        }
        host.finish_stream(id).map_err(|e| e.to_string())?;
        // A settlement that left on its own (a wake-up) is answered as the bridge would.
        if host.grpc_messages_sent() > sent {
            let last = host.grpc_streams().last();
            if let Some((token, message)) =
                last.and_then(|s| Some((s.token, s.messages.last()?.clone())))
            {
                host.grpc_message(token, &answer(&message))
                    .map_err(|e| e.to_string())?;
            }
        }
        fuel.push(host.fuel_since(mark));
    }
    fuel.sort_unstable();
    Ok(fuel[REQUESTS / 2])
}

/// The bridge's answer to a stream message of checks and settlements: every check of one
/// rule allowed, every settlement applied.
fn answer(message: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(message);
    let mut lines = text.split('\n');
    let mut reply = format!("{}\n", lines.next().unwrap_or_default());
    for line in lines.filter(|l| !l.is_empty()) {
        if line.starts_with("= ") {
            reply.push_str("1767225600000 s,99940,0,0\n");
        } else {
            reply.push_str(STREAM_ALLOWED);
        }
    }
    reply.into_bytes()
}

/// Compiles a module once (the slow part); each case boots a fresh host from it.
fn load(path: &Path) -> Result<Wasm, String> {
    Wasm::load(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A fresh host running `wasm` with `config`, which it must accept.
fn boot(wasm: &Wasm, config: &str) -> Result<Host, String> {
    let (host, accepted) = Host::boot(wasm, config).map_err(|e| e.to_string())?;
    if accepted {
        Ok(host)
    } else {
        Err(format!(
            "the filter refused the configuration {config}:\n{}",
            host.log_text()
        ))
    }
}

/// The median fuel of `REQUESTS` requests, each answered with `reply` when it calls out;
/// each response must show the limit (`X-RateLimit-Limit`) or not, as `shows_limit` says.
fn median(
    wasm: &Wasm,
    config: &str,
    reply: Option<&str>,
    shows_limit: bool,
) -> Result<u64, String> {
    median_of(&mut boot(wasm, config)?, reply, shows_limit)
}

/// The median fuel of `REQUESTS` requests admitted from a lease: the first request checks,
/// the second asks for the lease, the rest use it.
fn leased(wasm: &Wasm) -> Result<u64, String> {
    let mut host = boot(wasm, LEASED_CONFIG)?;
    one_request(&mut host, Some(ALLOWED))?;
    one_request(&mut host, Some(GRANTED))?;
    median_of(&mut host, None, true)
}

fn median_of(host: &mut Host, reply: Option<&str>, shows_limit: bool) -> Result<u64, String> {
    let mut fuel = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let (used, shown) = one_request(host, reply)?;
        if shown != shows_limit {
            return Err(format!(
                "a response {} X-RateLimit-Limit:\n{}",
                if shown { "shows" } else { "lacks" },
                host.log_text()
            ));
        }
        fuel.push(used);
    }
    fuel.sort_unstable();
    Ok(fuel[REQUESTS / 2])
}

/// Fuel per callback of one allowed request and of one admitted from a lease (after a
/// few to warm up), one line each.
fn breakdown(filter: &Path) -> Result<String, String> {
    let wasm = load(filter)?;
    let mut host = boot(&wasm, CONFIG)?;
    for _ in 0..REQUESTS {
        one_request(&mut host, Some(ALLOWED))?;
    }
    let mut lines = vec!["allowed:".to_string()];
    lines.extend(callbacks(&mut host, Some(ALLOWED))?);
    let mut host = boot(&wasm, LEASED_CONFIG)?;
    one_request(&mut host, Some(ALLOWED))?;
    one_request(&mut host, Some(GRANTED))?;
    for _ in 0..REQUESTS {
        one_request(&mut host, None)?;
    }
    lines.push("leased:".to_string());
    lines.extend(callbacks(&mut host, None)?);
    Ok(lines.join("\n"))
}

fn callbacks(host: &mut Host, reply: Option<&str>) -> Result<Vec<String>, String> {
    let mark = host.fuel_mark();
    one_request(host, reply)?;
    Ok(host.state().fuel[mark..]
        .iter()
        .map(|r| format!("{:>8} {}", r.fuel, r.callback))
        .collect())
}

/// Fuel of every callback of one request, from its headers to the end of its stream, and
/// whether the client's response shows its limit.
fn one_request(host: &mut Host, reply: Option<&str>) -> Result<(u64, bool), String> {
    let mark = host.fuel_mark();
    let headers = [("x-user-id", "alice")];
    // The filter's one stream; this request's check is its last message, if it sent one.
    let (id, message) = host
        .request_on_stream("GET", "/api/profile", &headers)
        .map_err(|e| e.to_string())?;
    match (message, reply) {
        (Some((token, message)), Some(body)) => {
            let text = String::from_utf8_lossy(&message);
            let exchange = text.split('\n').next().unwrap_or_default();
            host.grpc_message(token, format!("{exchange}\n{body}").as_bytes())
                .map_err(|e| e.to_string())?
        }
        (None, None) => {}
        (Some(_), None) => return Err("a check where none was expected".into()),
        (None, Some(_)) => return Err(format!("no check sent:\n{}", host.log_text())),
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
    let stream = host.stream(id).map_err(|e| e.to_string())?;
    let shown = match stream.local_reply() {
        Some(reply) => reply.header(LIMIT).is_some(),
        None => abi::first(&stream.response_headers, LIMIT).is_some(),
    };
    host.finish_stream(id).map_err(|e| e.to_string())?;
    Ok((host.fuel_since(mark), shown))
}
