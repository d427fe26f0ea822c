//! In-flight rules in the redis-call build (Higress with no bridge): the filter takes a
//! request's slot in its script call, renews it on the tick while the request lives, and
//! gives it back when the request ends, each as its own call to a real Valkey.

use crate::redis::{boot, on_redis, pending, run_live};
use std::io::{Read, Write};
use std::time::Duration;
use test_support::Valkey;
use wasmtime_harness::{Action, Host};

/// One command's integer reply (`:N\r\n`) from `valkey`.
fn integer(valkey: &Valkey, args: &[&str]) -> i64 {
    let mut conn = std::net::TcpStream::connect(valkey.addr()).unwrap();
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    conn.write_all(command.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        conn.read_exact(&mut byte).unwrap();
        reply.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&reply);
    text.trim_start_matches(':')
        .trim_end()
        .parse()
        .unwrap_or_else(|_| panic!("{text}"))
}

/// A request from alice, decided on `valkey`: its id and status (0: admitted).
fn ask(host: &mut Host, valkey: &Valkey) -> (u32, u32) {
    let (id, action) = host.request("GET", "/", &[("x-user-id", "alice")]).unwrap();
    if action == Action::Pause {
        run_live(host, valkey);
    }
    let stream = host.stream(id).unwrap();
    (id, stream.local_reply().map_or(0, |r| r.status))
}

#[test]
fn a_slot_is_taken_renewed_while_its_request_lives_and_given_back_at_its_end() {
    let valkey = Valkey::start();
    let rule = r#"{"name": "streams", "key": ["user"], "in_flight": {"max": 2, "ttl": "30s"}}"#;
    let mut host = boot(&on_redis(rule, "closed", 1000));
    let key = "rl:streams:alice";
    let (first, admitted) = ask(&mut host, &valkey);
    assert_eq!(admitted, 0, "{}", host.log_text());
    assert_eq!(ask(&mut host, &valkey).1, 0);
    assert_eq!(ask(&mut host, &valkey).1, 429, "two in flight");
    assert_eq!(integer(&valkey, &["ZCARD", key]), 2);
    // A third of the slots' life later, the tick renews both, in one call in settle mode
    // (answered before its timeout_ms runs out on the virtual clock).
    host.advance(Duration::from_millis(10_300)).unwrap();
    let renewals = pending(&host);
    assert_eq!(renewals.len(), 1, "{}", host.log_text());
    let call = host.state().redis.calls.len() - 1;
    let query = String::from_utf8_lossy(&host.state().redis.calls[call].query).into_owned();
    assert!(query.contains("\r\nsettle\r\n"), "{query}");
    let reply = run_live(&mut host, &valkey).remove(0);
    // `$56\r\n`, then the Redis time and three integers per slot: whether it was renewed
    // (still held), the slots free, 0.
    let packed = reply.get(5..61).expect("a packed reply of two rules");
    let int = |i: usize| i64::from_le_bytes(packed[8 * i..8 * i + 8].try_into().unwrap());
    assert_eq!((int(1), int(4)), (1, 1), "both slots renewed");
    // The first ends: its release goes out in refund mode, and a slot is free again.
    host.finish_stream(first).unwrap();
    let released = pending(&host);
    assert_eq!(released.len(), 1, "{}", host.log_text());
    run_live(&mut host, &valkey);
    assert_eq!(integer(&valkey, &["ZCARD", key]), 1);
    host.advance(Duration::from_millis(1_100)).unwrap();
    assert_eq!(ask(&mut host, &valkey).1, 0, "{}", host.log_text());
}
