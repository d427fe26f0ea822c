//! Host-call families the real filter never uses, driven by small hand-written guests:
//! bounds checks, shared data with CAS, metrics, ticks and the clocks, effective context,
//! traps carrying the guest's log, and the Higress redis call.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::time::Duration;
use wasmtime_harness::{Host, HostState, Wasm};

/// A guest with memory, an allocator (bump from 0x8000), and the given imports and body.
fn guest(body: &str) -> Wasm {
    let text = format!(
        r#"(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
  (import "env" "proxy_record_metric" (func $record (param i32 i64) (result i32)))
  (import "env" "proxy_get_metric" (func $get_metric (param i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick_period (param i32) (result i32)))
  (import "env" "proxy_get_current_time_nanoseconds" (func $now (param i32) (result i32)))
  (import "env" "proxy_set_effective_context" (func $effective (param i32) (result i32)))
  (import "env" "proxy_redis_init" (func $redis_init (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_redis_call" (func $redis_call (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "env" "proxy_made_up_call" (func $made_up (param i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 0x8000))
  (global (export "status") (mut i32) (i32.const -1))
  (data (i32.const 16) "key")
  (data (i32.const 32) "v1")
  (data (i32.const 48) "hits")
  (data (i32.const 64) "redis")
  (data (i32.const 80) "*1\0d\0a$4\0d\0aPING\0d\0a")
  (data (i32.const 128) "ticked")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32)
    (global.get $heap)
    (global.set $heap (i32.add (global.get $heap) (local.get 0))))
  (func (export "proxy_on_tick") (param i32)
    (drop (call $log (i32.const 2) (i32.const 128) (i32.const 6))))
  {body})"#
    );
    Wasm::from_bytes(&wat::parse_str(text).unwrap()).unwrap()
}

fn status(host: &mut Host) -> i32 {
    host.global_i32("status").unwrap()
}

#[test]
fn out_of_bounds_pointers_get_invalid_memory_access_not_a_crash() {
    let wasm = guest(
        r#"(func (export "run") (param i32)
             (global.set 1 (call $log (i32.const 2) (local.get 0) (i32.const 16))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    for (ptr, expect) in [(0, 0), (65_536 - 16, 0), (65_536 - 15, 6), (-1, 6)] {
        host.call::<i32, ()>("run", 0, ptr).unwrap();
        assert_eq!(status(&mut host), expect, "ptr {ptr}");
    }
}

#[test]
fn shared_data_compare_and_swap() {
    let wasm = guest(
        r#"(func (export "set") (param $cas i32)
             (global.set 1 (call $set_shared (i32.const 16) (i32.const 3) (i32.const 32) (i32.const 2) (local.get $cas))))
           (func (export "get")
             (global.set 1 (call $get_shared (i32.const 16) (i32.const 3) (i32.const 200) (i32.const 204) (i32.const 208))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    host.call::<(), ()>("get", 0, ()).unwrap();
    assert_eq!(status(&mut host), 1, "NotFound before any set");
    host.call::<i32, ()>("set", 0, 0).unwrap();
    assert_eq!(status(&mut host), 0);
    let (value, cas) = host.state().shared.get(b"key".as_slice()).cloned().unwrap();
    assert_eq!(value, b"v1");
    host.call::<(), ()>("get", 0, ()).unwrap();
    assert_eq!(status(&mut host), 0);
    assert_eq!(host.read_memory(208, 4).unwrap(), cas.to_le_bytes());
    let ptr = u32::from_le_bytes(host.read_memory(200, 4).unwrap().try_into().unwrap());
    assert_eq!(
        host.read_memory(ptr, 2).unwrap(),
        b"v1",
        "handed over through the guest allocator"
    );
    host.call::<i32, ()>("set", 0, (cas + 7) as i32).unwrap();
    assert_eq!(status(&mut host), 8, "CasMismatch on a stale cas");
    host.call::<i32, ()>("set", 0, cas as i32).unwrap();
    assert_eq!(status(&mut host), 0);
    assert_ne!(
        host.state().shared[&b"key".to_vec()].1,
        cas,
        "a write moves the cas on"
    );
}

#[test]
fn metrics_define_increment_record_get() {
    let wasm = guest(
        r#"(func (export "run") (param $kind i32)
             (local $id i32)
             (drop (call $define (local.get $kind) (i32.const 48) (i32.const 4) (i32.const 200)))
             (local.set $id (i32.load (i32.const 200)))
             (drop (call $inc (local.get $id) (i64.const 5)))
             (drop (call $inc (local.get $id) (i64.const 2)))
             (global.set 1 (call $get_metric (local.get $id) (i32.const 208))))
           (func (export "record") (param $id i32) (param $v i64)
             (global.set 1 (call $record (local.get $id) (local.get $v))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    host.call::<i32, ()>("run", 0, 0).unwrap();
    assert_eq!(status(&mut host), 0);
    assert_eq!(host.read_memory(208, 8).unwrap(), 7u64.to_le_bytes());
    host.call::<i32, ()>("run", 0, 0).unwrap();
    assert_eq!(host.state().metrics[0].value, 14, "same name, same counter");
    host.call::<i32, ()>("run", 0, 2).unwrap();
    assert_eq!(
        status(&mut host),
        2,
        "a histogram cannot be incremented or read"
    );
    host.call::<(i32, i64), ()>("record", 0, (2, 40)).unwrap();
    assert_eq!(host.state().metrics[1].recorded, [40]);
    host.call::<(i32, i64), ()>("record", 0, (99, 1)).unwrap();
    assert_eq!(status(&mut host), 1, "unknown metric");
}

#[test]
fn ticks_fire_as_the_virtual_clock_advances_and_both_clocks_agree() {
    let wasm = guest(
        r#"(func (export "proxy_on_context_create") (param i32 i32))
           (func (export "proxy_on_vm_start") (param i32 i32) (result i32)
             (drop (call $tick_period (i32.const 100))) (i32.const 1))
           (func (export "now")
             (drop (call $now (i32.const 200)))
             (global.set 1 (call $clock (i32.const 0) (i64.const 1) (i32.const 208))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    assert!(host.start(b"").unwrap());
    host.advance(Duration::from_millis(99)).unwrap();
    assert_eq!(host.state().logs.len(), 0);
    host.advance(Duration::from_millis(250)).unwrap();
    assert_eq!(
        host.state()
            .logs
            .iter()
            .filter(|l| l.message == "ticked")
            .count(),
        3
    );
    host.call::<(), ()>("now", 0, ()).unwrap();
    let proxy = host.read_memory(200, 8).unwrap();
    assert_eq!(proxy, host.read_memory(208, 8).unwrap());
    let start = 1_767_225_600_000_000_000u64;
    assert_eq!(
        u64::from_le_bytes(proxy.try_into().unwrap()),
        start + 349_000_000
    );
}

#[test]
fn effective_context_accepts_live_contexts_only() {
    let wasm = guest(
        r#"(func (export "proxy_on_context_create") (param i32 i32))
           (func (export "switch") (param i32)
             (global.set 1 (call $effective (local.get 0)))
             (drop (call $log (i32.const 2) (i32.const 16) (i32.const 3))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    host.start(b"").unwrap();
    let stream = host.new_stream().unwrap();
    host.call::<i32, ()>("switch", 1, stream as i32).unwrap();
    assert_eq!(status(&mut host), 0);
    assert_eq!(
        host.state().logs.last().unwrap().context_id,
        stream,
        "logs follow the switch"
    );
    host.call::<i32, ()>("switch", 1, 999).unwrap();
    assert_eq!(status(&mut host), 2);
}

#[test]
fn a_trap_is_an_error_with_the_guest_log_and_unserved_imports_are_named() {
    let wasm = guest(
        r#"(func (export "boom")
             (drop (call $log (i32.const 5) (i32.const 16) (i32.const 3)))
             unreachable)
           (func (export "exotic") (drop (call $made_up (i32.const 1))))"#,
    );
    let mut host = Host::new(&wasm).unwrap();
    assert_eq!(host.unserved_imports(), ["env.proxy_made_up_call"]);
    let text = host
        .call::<(), ()>("boom", 0, ())
        .unwrap_err()
        .trap_text()
        .unwrap();
    assert!(
        text.contains("boom") && text.contains("Critical [0] key"),
        "{text}"
    );
    let mut host = Host::new(&wasm).unwrap();
    let text = host
        .call::<(), ()>("exotic", 0, ())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("env.proxy_made_up_call is not served"),
        "{text}"
    );
}

/// A guest whose `call` sends `PING` through the redis call and whose callback copies the
/// reply (buffer 9) into its memory, leaving the pointer at 204.
fn redis_guest() -> Wasm {
    guest(
        r#"(func (export "proxy_on_context_create") (param i32 i32))
           (func (export "call")
             (drop (call $redis_init (i32.const 64) (i32.const 5) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 500)))
             (global.set 1 (call $redis_call (i32.const 64) (i32.const 5) (i32.const 80) (i32.const 14) (i32.const 200))))
           (func (export "proxy_on_redis_call_response") (param i32 i32 i32 i32)
             (global.set 1 (call $get_buffer (i32.const 9) (i32.const 0) (local.get 3) (i32.const 204) (i32.const 208))))"#,
    )
}

#[test]
fn redis_calls_are_captured_and_answered_on_the_root_context() {
    let wasm = redis_guest();
    let mut host = Host::new(&wasm).unwrap();
    host.start(b"").unwrap();
    host.call::<(), ()>("call", 1, ()).unwrap();
    assert_eq!(status(&mut host), 0);
    let call = host.state().redis.calls[0].clone();
    assert_eq!(
        (call.cluster.as_str(), call.query.as_slice()),
        ("redis", &b"*1\r\n$4\r\nPING\r\n"[..])
    );
    host.answer_redis(call.token, 0, b"+PONG\r\n").unwrap();
    assert_eq!(status(&mut host), 0);
    let ptr = u32::from_le_bytes(host.read_memory(204, 4).unwrap().try_into().unwrap());
    assert_eq!(host.read_memory(ptr, 7).unwrap(), b"+PONG\r\n");
    // Outside the callback buffer 9 does not exist.
    assert!(host.state().redis.reply.is_none());
}

#[test]
fn guests_without_state_share_nothing() {
    // Two hosts from one module: state lives in each Store, so parallel tests are isolated.
    let wasm = guest(
        r#"(func (export "set") (drop (call $set_shared (i32.const 16) (i32.const 3) (i32.const 32) (i32.const 2) (i32.const 0))))"#,
    );
    let mut a = Host::with_state(&wasm, HostState::default()).unwrap();
    let b = Host::new(&wasm).unwrap();
    a.call::<(), ()>("set", 0, ()).unwrap();
    assert_eq!(a.state().shared.len(), 1);
    assert!(b.state().shared.is_empty());
}

#[test]
fn a_redis_call_runs_live_against_a_real_valkey() {
    let valkey = test_support::Valkey::start();
    let wasm = redis_guest();
    let mut host = Host::new(&wasm).unwrap();
    host.start(b"").unwrap();
    host.call::<(), ()>("call", 1, ()).unwrap();
    let token = host.state().redis.calls[0].token;
    // The guest's RESP query (PING) went to the real server; its reply reached the guest.
    assert_eq!(
        host.forward_redis(token, valkey.addr()).unwrap(),
        b"+PONG\r\n"
    );
    assert_eq!(status(&mut host), 0);
    let ptr = u32::from_le_bytes(host.read_memory(204, 4).unwrap().try_into().unwrap());
    assert_eq!(host.read_memory(ptr, 7).unwrap(), b"+PONG\r\n");
}
