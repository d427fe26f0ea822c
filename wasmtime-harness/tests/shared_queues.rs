//! Shared queues served as Envoy 1.40 serves them, driven by a small hand-written guest:
//! tokens per name, resolve, enqueue and dequeue statuses, and `proxy_on_queue_ready`
//! delivered to the root after the enqueuing event, never inside it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::time::Duration;
use wasmtime_harness::{HarnessError, Host, Wasm};

/// A guest that registers "wake" (at 16) or "other" (at 32), resolves, enqueues and
/// dequeues on command, and records its `proxy_on_queue_ready` calls in exported globals.
fn guest() -> Wasm {
    let text = r#"(module
  (import "env" "proxy_register_shared_queue" (func $register (param i32 i32 i32) (result i32)))
  (import "env" "proxy_resolve_shared_queue" (func $resolve (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_enqueue_shared_queue" (func $enqueue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_dequeue_shared_queue" (func $dequeue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick_period (param i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 0x8000))
  (global $status (export "status") (mut i32) (i32.const -1))
  (global $token (export "token") (mut i32) (i32.const 0))
  (global $got_ptr (export "got_ptr") (mut i32) (i32.const 0))
  (global $got_len (export "got_len") (mut i32) (i32.const -1))
  (global $ready_ctx (export "ready_ctx") (mut i32) (i32.const 0))
  (global $ready_token (export "ready_token") (mut i32) (i32.const 0))
  (global $ready_count (export "ready_count") (mut i32) (i32.const 0))
  (global $ready_during (export "ready_during") (mut i32) (i32.const -1))
  (global $ready_in_log (export "ready_in_log") (mut i32) (i32.const -1))
  (global $reenqueue (mut i32) (i32.const 0))
  (data (i32.const 16) "wake")
  (data (i32.const 32) "other")
  (data (i32.const 48) "harness")
  (data (i32.const 64) "a")
  (data (i32.const 72) "bb")
  (data (i32.const 80) "ccc")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32)
    (global.get $heap)
    (global.set $heap (i32.add (global.get $heap) (local.get 0))))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func $reg (param $ptr i32) (param $len i32)
    (global.set $status (call $register (local.get $ptr) (local.get $len) (i32.const 200)))
    (global.set $token (i32.load (i32.const 200))))
  (func (export "register") (call $reg (i32.const 16) (i32.const 4)))
  (func (export "register_other") (call $reg (i32.const 32) (i32.const 5)))
  (func (export "resolve") (param i32 i32 i32 i32)
    (i32.store (i32.const 204) (i32.const 0))
    (global.set $status (call $resolve (local.get 0) (local.get 1) (local.get 2) (local.get 3)
      (i32.const 204)))
    (global.set $token (i32.load (i32.const 204))))
  (func $enq (param $token i32) (param $ptr i32) (param $len i32)
    (global.set $status (call $enqueue (local.get $token) (local.get $ptr) (local.get $len)))
    (global.set $ready_during (global.get $ready_count)))
  (func (export "enqueue") (param i32 i32 i32)
    (call $enq (local.get 0) (local.get 1) (local.get 2)))
  (func (export "enqueue_twice") (param $token i32)
    (call $enq (local.get $token) (i32.const 64) (i32.const 1))
    (call $enq (local.get $token) (i32.const 72) (i32.const 2)))
  (func (export "dequeue") (param $token i32)
    (global.set $status (call $dequeue (local.get $token) (i32.const 208) (i32.const 212)))
    (global.set $got_ptr (i32.load (i32.const 208)))
    (global.set $got_len (i32.load (i32.const 212))))
  (func (export "set_reenqueue") (param i32) (global.set $reenqueue (local.get 0)))
  (func (export "proxy_on_queue_ready") (param $ctx i32) (param $token i32)
    (global.set $ready_ctx (local.get $ctx))
    (global.set $ready_token (local.get $token))
    (global.set $ready_count (i32.add (global.get $ready_count) (i32.const 1)))
    (if (i32.gt_s (global.get $reenqueue) (i32.const 0))
      (then
        (global.set $reenqueue (i32.sub (global.get $reenqueue) (i32.const 1)))
        (drop (call $enqueue (local.get $token) (i32.const 64) (i32.const 1))))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (call $reg (i32.const 16) (i32.const 4))
    (call $enq (global.get $token) (i32.const 72) (i32.const 2))
    (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32)
    (call $enq (global.get $token) (i32.const 80) (i32.const 3))
    (i32.const 1))
  (func (export "tick_every") (param i32) (drop (call $tick_period (local.get 0))))
  (func (export "proxy_on_tick") (param i32)
    (call $enq (global.get $token) (i32.const 64) (i32.const 1)))
  (func (export "proxy_on_log") (param i32)
    (global.set $ready_in_log (global.get $ready_count))))"#;
    Wasm::from_bytes(&wat::parse_str(text).unwrap()).unwrap()
}

fn started() -> (Host, u32) {
    let mut host = Host::new(&guest()).unwrap();
    assert!(host.start(b"").unwrap());
    let root = host.state().root_id;
    (host, root)
}

fn global(host: &mut Host, name: &str) -> i32 {
    host.global_i32(name).unwrap()
}

/// Registers "wake" from the root; its token.
fn register(host: &mut Host, root: u32) -> u32 {
    host.call::<(), ()>("register", root, ()).unwrap();
    assert_eq!(global(host, "status"), 0);
    global(host, "token") as u32
}

#[test]
fn register_returns_a_token_per_name_and_the_same_one_again() {
    let (mut host, root) = started();
    let token = register(&mut host, root);
    assert_ne!(token, 0);
    assert_eq!(register(&mut host, root), token);
    host.call::<(), ()>("register_other", root, ()).unwrap();
    assert_eq!(global(&mut host, "status"), 0);
    let other = global(&mut host, "token") as u32;
    assert_ne!(other, token);
    let queues = host.shared_queues();
    assert_eq!(queues.len(), 2);
    let wake = host.shared_queue("wake").unwrap();
    assert_eq!(
        (wake.token, wake.vm_id.as_str(), wake.context_id),
        (token, "harness", root)
    );
    assert!(wake.items.is_empty());
}

#[test]
fn resolve_finds_a_registered_queue_by_vm_id_and_name_only() {
    let (mut host, root) = started();
    let token = register(&mut host, root);
    host.call::<(i32, i32, i32, i32), ()>("resolve", root, (48, 7, 16, 4))
        .unwrap();
    assert_eq!(
        (global(&mut host, "status"), global(&mut host, "token")),
        (0, token as i32)
    );
    // Another name, or the right name under another VM id: NotFound.
    for args in [(48, 7, 32, 5), (48, 6, 16, 4)] {
        host.call::<(i32, i32, i32, i32), ()>("resolve", root, args)
            .unwrap();
        assert_eq!(global(&mut host, "status"), 1, "{args:?}");
    }
}

#[test]
fn an_enqueue_wakes_the_root_after_the_enqueuing_callback_returns() {
    let (mut host, root) = started();
    let token = register(&mut host, root);
    host.call::<(i32, i32, i32), ()>("enqueue", root, (token as i32, 64, 1))
        .unwrap();
    assert_eq!(global(&mut host, "status"), 0);
    // Not re-entrantly: the enqueuing callback saw no notification...
    assert_eq!(global(&mut host, "ready_during"), 0);
    // ...and it came once the callback returned, to the root, with the token.
    assert_eq!(global(&mut host, "ready_count"), 1);
    assert_eq!(global(&mut host, "ready_ctx"), root as i32);
    assert_eq!(global(&mut host, "ready_token"), token as i32);
    assert_eq!(host.posted_notifications(), 0);
    // One notification per enqueue.
    host.call::<i32, ()>("enqueue_twice", root, token as i32)
        .unwrap();
    assert_eq!(global(&mut host, "ready_during"), 1);
    assert_eq!(global(&mut host, "ready_count"), 3);
    let wake = host.shared_queue("wake").unwrap();
    assert_eq!((wake.enqueued, wake.ready_delivered), (3, 3));
    assert_eq!(wake.items_text(), ["a", "a", "bb"]);
}

#[test]
fn an_http_context_registering_makes_its_root_the_one_notified_after_the_whole_event() {
    let (mut host, root) = started();
    // Registered from the stream's callback: the root is notified, after the request.
    let (id, _) = host.request("GET", "/", &[]).unwrap();
    assert_ne!(id, root);
    assert_eq!(global(&mut host, "ready_during"), 0);
    assert_eq!(global(&mut host, "ready_count"), 1);
    assert_eq!(global(&mut host, "ready_ctx"), root as i32);
    assert_eq!(host.shared_queue("wake").unwrap().context_id, root);
    // Enqueued in proxy_on_done: delivered after on_log and on_delete, not between.
    host.finish_stream(id).unwrap();
    assert_eq!(global(&mut host, "ready_in_log"), 1);
    assert_eq!(global(&mut host, "ready_count"), 2);
}

#[test]
fn dequeue_returns_items_in_order_then_empty() {
    let (mut host, root) = started();
    let token = register(&mut host, root) as i32;
    for (ptr, len) in [(64, 1), (72, 2), (80, 3)] {
        host.call::<(i32, i32, i32), ()>("enqueue", root, (token, ptr, len))
            .unwrap();
    }
    assert_eq!(
        host.shared_queue("wake").unwrap().items_text(),
        ["a", "bb", "ccc"]
    );
    for expect in ["a", "bb", "ccc"] {
        host.call::<i32, ()>("dequeue", root, token).unwrap();
        assert_eq!(global(&mut host, "status"), 0);
        let (ptr, len) = (global(&mut host, "got_ptr"), global(&mut host, "got_len"));
        let bytes = host.read_memory(ptr as u32, len as usize).unwrap();
        assert_eq!(bytes, expect.as_bytes());
    }
    host.call::<i32, ()>("dequeue", root, token).unwrap();
    assert_eq!(global(&mut host, "status"), 7, "Empty");
    assert!(host.shared_queue("wake").unwrap().items.is_empty());
}

#[test]
fn unknown_tokens_are_not_found() {
    let (mut host, root) = started();
    register(&mut host, root);
    host.call::<(i32, i32, i32), ()>("enqueue", root, (999, 64, 1))
        .unwrap();
    assert_eq!(global(&mut host, "status"), 1);
    host.call::<i32, ()>("dequeue", root, 999).unwrap();
    assert_eq!(global(&mut host, "status"), 1);
    assert_eq!(global(&mut host, "ready_count"), 0);
    assert_eq!(host.posted_notifications(), 0);
}

#[test]
fn a_queue_ready_that_enqueues_again_is_notified_again() {
    let (mut host, root) = started();
    let token = register(&mut host, root) as i32;
    host.call::<i32, ()>("set_reenqueue", root, 3).unwrap();
    host.call::<(i32, i32, i32), ()>("enqueue", root, (token, 72, 2))
        .unwrap();
    assert_eq!(global(&mut host, "ready_count"), 4);
    let wake = host.shared_queue("wake").unwrap();
    assert_eq!((wake.enqueued, wake.ready_delivered), (4, 4));
    assert_eq!(wake.items_text(), ["bb", "a", "a", "a"]);
}

#[test]
fn a_guest_that_enqueues_in_every_queue_ready_is_stopped() {
    let (mut host, root) = started();
    let token = register(&mut host, root) as i32;
    host.call::<i32, ()>("set_reenqueue", root, i32::MAX)
        .unwrap();
    let err = host
        .call::<(i32, i32, i32), ()>("enqueue", root, (token, 64, 1))
        .unwrap_err();
    assert!(matches!(err, HarnessError::Usage(_)), "{err}");
    assert_eq!(
        global(&mut host, "ready_count") as usize,
        wasmtime_harness::queue::MAX_POSTED_PER_EVENT
    );
}

#[test]
fn each_tick_is_its_own_event_followed_by_what_it_posted() {
    let (mut host, root) = started();
    register(&mut host, root);
    host.call::<i32, ()>("tick_every", root, 1000).unwrap();
    host.advance(Duration::from_secs(3)).unwrap();
    assert_eq!(global(&mut host, "ready_count"), 3);
    // The third tick saw the first two notifications already delivered.
    assert_eq!(global(&mut host, "ready_during"), 2);
}
