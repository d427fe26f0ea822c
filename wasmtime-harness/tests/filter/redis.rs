//! The redis-call build (`dist/ratelimit-redis.wasm`) as Higress runs it: the filter calls
//! `proxy_redis_init` once and runs the token bucket script on Redis through
//! `proxy_redis_call`, here forwarded live to a real Valkey. Decisions must be the
//! bridge's: exact bursts, all-or-nothing checks, the same failure modes.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;
use test_support::Valkey;
use wasmtime_harness::{Action, Host, Wasm};

/// `$RATELIMIT_REDIS_WASM`, or `<repo>/dist/ratelimit-redis.wasm`, compiled once.
pub fn redis_wasm() -> &'static Wasm {
    static WASM: OnceLock<Result<Wasm, String>> = OnceLock::new();
    let loaded = WASM.get_or_init(|| {
        let path = match std::env::var_os("RATELIMIT_REDIS_WASM") {
            Some(p) if !p.is_empty() => p.into(),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/ratelimit-redis.wasm"),
        };
        Wasm::load(&path).map_err(|e| e.to_string())
    });
    match loaded {
        Ok(w) => w,
        Err(e) => panic!("{e} (make build)"),
    }
}

pub const CLUSTER: &str = "outbound|6379||redis.default.svc.cluster.local";

/// `rules` (JSON objects) keyed on `x-user-id`, a redis backend with `timeout_ms`.
pub fn on_redis(rules: &str, failure_mode: &str, timeout_ms: u32) -> String {
    format!(
        r#"{{"backend": {{"redis": {{"cluster": "{CLUSTER}", "timeout_ms": {timeout_ms}}}}},
            "failure_mode": "{failure_mode}",
            "identity": {{"user": {{"header": "x-user-id"}}}},
            "rules": [{rules}]}}"#
    )
}

/// A per-user rule `name` with a bucket of `burst`, refilling slowly (per hour).
pub fn per_user(name: &str, burst: u32) -> String {
    format!(
        r#"{{"name": "{name}", "key": ["user"],
            "limit": {{"requests": {burst}, "per": "1h", "burst": {burst}}}}}"#
    )
}

pub fn boot(config: &str) -> Host {
    let (host, accepted) = Host::boot(redis_wasm(), config).unwrap();
    assert!(accepted, "config refused:\n{}", host.log_text());
    host
}

/// The redis calls not answered yet, oldest first.
pub fn pending(host: &Host) -> Vec<u32> {
    let calls = &host.state().redis.calls;
    calls
        .iter()
        .filter(|c| !c.answered)
        .map(|c| c.token)
        .collect()
}

/// Runs every pending redis call on `valkey` (and those its replies lead to: a resend
/// after `NOSCRIPT`); the raw replies.
pub fn run_live(host: &mut Host, valkey: &Valkey) -> Vec<Vec<u8>> {
    let mut replies = Vec::new();
    while let Some(&token) = pending(host).first() {
        replies.push(host.forward_redis(token, valkey.addr()).unwrap());
    }
    replies
}

/// A request from `user`, decided on `valkey`: the stream id.
fn decided(host: &mut Host, valkey: &Valkey, user: &str) -> u32 {
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    if action == Action::Pause {
        run_live(host, valkey);
    }
    id
}

fn allowed(host: &Host, id: u32) -> bool {
    let stream = host.stream(id).unwrap();
    stream.local_reply().is_none() && stream.resumed()
}

fn denied(host: &Host, id: u32) -> bool {
    let reply = host.stream(id).unwrap().local_reply().map(|r| r.status);
    reply == Some(429)
}

/// How a call that names the script by its SHA1 goes on after the array's length.
const EVALSHA: &str = "\r\n$7\r\nEVALSHA\r\n$40\r\n";

fn query_text(host: &Host, nth: usize) -> String {
    String::from_utf8_lossy(&host.state().redis.calls[nth].query).into_owned()
}

#[test]
fn an_exact_burst_is_admitted_then_denied_with_headers() {
    let valkey = Valkey::start();
    let mut host = boot(&on_redis(&per_user("r", 3), "closed", 1000));
    let cluster = &host.state().redis.clusters[0];
    assert_eq!((cluster.name.as_str(), cluster.timeout_ms), (CLUSTER, 1000));

    let first = decided(&mut host, &valkey, "alice");
    assert!(allowed(&host, first), "{}", host.log_text());
    // A fresh server lacks the script: EVALSHA, NOSCRIPT, then EVAL once.
    assert!(query_text(&host, 0).contains(EVALSHA));
    // EVAL, the script, 1 key and its name, mode, 1 shape of 19 numbers, the layout, the
    // ids (none): 27.
    assert!(query_text(&host, 1).starts_with("*27\r\n$4\r\nEVAL\r\n"));
    host.response_headers(first, &[(":status", "200")], true)
        .unwrap();
    let headers = &host.stream(first).unwrap().response_headers;
    let value = |n: &str| wasmtime_harness::abi::first(headers, n);
    assert_eq!(value("x-ratelimit-limit").as_deref(), Some("3"));
    assert_eq!(value("x-ratelimit-remaining").as_deref(), Some("2"));

    for _ in 0..2 {
        let id = decided(&mut host, &valkey, "alice");
        assert!(allowed(&host, id), "{}", host.log_text());
    }
    let last = decided(&mut host, &valkey, "alice");
    assert!(denied(&host, last), "{}", host.log_text());
    let reply = host.stream(last).unwrap().local_reply().unwrap();
    assert_eq!(reply.header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert!(reply.header("retry-after").is_some());
    // After the first, every call named the script by its SHA1 and Redis knew it.
    let calls = &host.state().redis.calls;
    assert!(calls[2..]
        .iter()
        .all(|c| String::from_utf8_lossy(&c.query).starts_with(&format!("*27{EVALSHA}"))));
    assert_eq!(calls.len(), 5, "one call per check, one NOSCRIPT resend");
    // Another client has its own bucket.
    let bob = decided(&mut host, &valkey, "bob");
    assert!(allowed(&host, bob));
}

#[test]
fn a_check_is_all_or_nothing_across_two_rules() {
    let valkey = Valkey::start();
    let global = r#"{"name": "g", "key": [], "limit": {"requests": 3, "per": "1h", "burst": 3}}"#;
    let rules = format!("{}, {global}", per_user("u", 2));
    let mut host = boot(&on_redis(&rules, "closed", 1000));
    for _ in 0..2 {
        let id = decided(&mut host, &valkey, "alice");
        assert!(allowed(&host, id), "{}", host.log_text());
    }
    // Alice's own bucket denies her third: the global bucket keeps its last token.
    let third = decided(&mut host, &valkey, "alice");
    assert!(denied(&host, third));
    let bob = decided(&mut host, &valkey, "bob");
    assert!(allowed(&host, bob), "the global token was not taken");
    // Now the global bucket denies, and Bob's own bucket is not charged for it.
    let carol = decided(&mut host, &valkey, "carol");
    assert!(denied(&host, carol));
    let bucket = wasmtime_harness::redis::command(&[b"EXISTS", b"rl:u:carol"]);
    let exists =
        wasmtime_harness::live::execute_redis(valkey.addr(), &bucket, Duration::from_secs(1));
    assert_eq!(
        exists.unwrap(),
        b":0\r\n",
        "a denied check writes no bucket"
    );
}

#[test]
fn a_flushed_script_is_sent_again_and_the_request_still_decided() {
    let valkey = Valkey::start();
    let mut host = boot(&on_redis(&per_user("r", 5), "closed", 1000));
    let id = decided(&mut host, &valkey, "alice");
    assert!(allowed(&host, id));
    let flush = wasmtime_harness::redis::command(&[b"SCRIPT", b"FLUSH"]);
    wasmtime_harness::live::execute_redis(valkey.addr(), &flush, Duration::from_secs(1)).unwrap();
    let before = host.state().redis.calls.len();
    let (id, _) = host.request("GET", "/", &[("x-user-id", "alice")]).unwrap();
    let replies = run_live(&mut host, &valkey);
    assert!(replies[0].starts_with(b"-NOSCRIPT"), "{replies:?}");
    assert_eq!(host.state().redis.calls.len(), before + 2, "one resend");
    assert!(allowed(&host, id), "{}", host.log_text());
    assert!(host.log_text().contains("sending it again"));
}

#[test]
fn lease_returns_travel_as_a_refund_call() {
    let valkey = Valkey::start();
    let rule = r#"{"name": "g", "key": [], "limit": {"requests": 100, "per": "1h", "burst": 100},
                   "lease": {"tokens": 10, "ttl": "1s"}}"#;
    let mut host = boot(&on_redis(rule, "closed", 1000));
    // The second check of the same bucket within the ttl asks for a lease.
    for _ in 0..2 {
        let id = decided(&mut host, &valkey, "u");
        assert!(allowed(&host, id), "{}", host.log_text());
    }
    let leased = host.request("GET", "/", &[("x-user-id", "u")]).unwrap();
    assert_eq!(leased.1, Action::Continue, "admitted from the lease");
    // The ttl ends: what is left goes back in a call of its own, in refund mode.
    host.advance(Duration::from_secs(2)).unwrap();
    let returned = pending(&host);
    assert_eq!(returned.len(), 1, "{}", host.log_text());
    let query = query_text(&host, host.state().redis.calls.len() - 1);
    assert!(query.contains("\r\nrefund\r\n"), "{query}");
    let reply = host.forward_redis(returned[0], valkey.addr()).unwrap();
    assert!(
        // The Redis time and one rule's three integers, packed.
        reply.starts_with(b"$32\r\n"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

#[test]
fn the_login_goes_to_proxy_redis_init_and_never_to_the_log() {
    let config = on_redis(&per_user("r", 3), "closed", 25).replacen(
        r#""timeout_ms": 25"#,
        r#""timeout_ms": 25, "username": "ratelimit", "password": "s3cret-pw""#,
        1,
    );
    let host = boot(&config);
    let cluster = &host.state().redis.clusters[0];
    assert_eq!(cluster.username, b"ratelimit");
    assert_eq!(cluster.password, b"s3cret-pw");
    assert_eq!(cluster.timeout_ms, 25);
    assert!(!host.log_text().contains("s3cret"));
}

#[test]
fn each_build_refuses_the_other_s_backend() {
    let redis_config = on_redis(&per_user("r", 3), "closed", 25);
    let (host, accepted) = Host::boot(crate::common::wasm(), &redis_config).unwrap();
    assert!(!accepted);
    assert!(
        host.log_text().contains("use ratelimit-redis.wasm"),
        "{}",
        host.log_text()
    );
    let bridge_config = crate::common::one_rule(r#"{"header": "x-user-id"}"#, "closed");
    let (host, accepted) = Host::boot(redis_wasm(), &bridge_config).unwrap();
    assert!(!accepted);
    assert!(
        host.log_text().contains("talks to Redis"),
        "{}",
        host.log_text()
    );
}

#[test]
fn only_the_redis_build_imports_the_redis_call() {
    let redis_imports = |wasm: &Wasm| -> Vec<String> {
        wasm.module
            .imports()
            .filter(|i| i.name().contains("redis"))
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect()
    };
    assert_eq!(redis_imports(crate::common::wasm()), Vec::<String>::new());
    let mut imports = redis_imports(redis_wasm());
    imports.sort();
    assert_eq!(imports, ["env.proxy_redis_call", "env.proxy_redis_init"]);
    let mut host = Host::new(redis_wasm()).unwrap();
    assert!(host.exports("proxy_on_redis_call_response"));
    let mut unserved = host.unserved_imports().to_vec();
    unserved.sort();
    assert_eq!(
        unserved,
        ["env.proxy_call_foreign_function", "env.proxy_grpc_call"]
    );
}

/// A per-user rule metered by a usage header, reserving 100 of 1,000 tokens an hour.
fn metered_rule() -> String {
    r#"{"name": "tokens", "key": ["user"], "limit": {"requests": 1000, "per": "1h"},
        "meter": {"header": "x-usage-tokens", "reserve": 100, "debt": 500}}"#
        .to_string()
}

/// Whole tokens left in `key`'s bucket on `valkey` (the script's stored level, tag 3).
fn tokens_left(valkey: &Valkey, key: &str, den: f64) -> f64 {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(valkey.addr()).unwrap();
    let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    conn.write_all(get.as_bytes()).unwrap();
    // `$25\r\n`, the 25 bytes, `\r\n`.
    let mut reply = [0u8; 32];
    conn.read_exact(&mut reply).unwrap();
    assert_eq!((&reply[..5], reply[5]), (&b"$25\r\n"[..], 3), "{reply:?}");
    f64::from_le_bytes(reply[6..14].try_into().unwrap()) / den
}

#[test]
fn a_metered_response_settles_on_redis_in_the_redis_call_build_once() {
    let valkey = Valkey::start();
    let mut host = boot(&on_redis(&metered_rule(), "closed", 1000));
    let id = decided(&mut host, &valkey, "alice");
    assert!(allowed(&host, id), "{}", host.log_text());
    // 1,000 an hour: a token is 3,600 units (3.6 s), refilling 1 unit a ms.
    let key = "rl:tokens:alice";
    assert!(
        (tokens_left(&valkey, key, 3600.0) - 900.0).abs() < 1.0,
        "reserved 100"
    );
    let headers = [(":status", "200"), ("x-usage-tokens", "350")];
    host.response_headers(id, &headers, true).unwrap();
    host.finish_stream(id).unwrap();
    // The settlement is its own redis call, in the script's settle mode.
    run_live(&mut host, &valkey);
    let settle = (host.state().redis.calls.iter())
        .filter(|c| String::from_utf8_lossy(&c.query).contains("\r\n$6\r\nsettle\r\n"))
        .count();
    assert_eq!(settle, 1, "{}", host.log_text());
    assert!(
        (tokens_left(&valkey, key, 3600.0) - 650.0).abs() < 1.0,
        "350 in all"
    );
    // The next request reserves again, from what is left.
    let next = decided(&mut host, &valkey, "alice");
    assert!(allowed(&host, next));
    assert!((tokens_left(&valkey, key, 3600.0) - 550.0).abs() < 1.0);
}
