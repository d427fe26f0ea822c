//! gRPC streams served as Envoy 1.40 serves them, driven by a small hand-written guest:
//! tokens, statuses, messages both ways on the root context, metadata, close and cancel,
//! and live forwarding of stream messages to an HTTP bridge.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;
use wasmtime_harness::abi::decode_pairs;
use wasmtime_harness::{pairs, Host, HostState, Wasm};

/// A guest that opens streams (cluster at 16 "bridge" or 112 "nope"), sends and closes on
/// command, and records every stream callback in exported globals.
fn guest() -> Wasm {
    let text = r#"(module
  (import "env" "proxy_grpc_stream" (func $stream (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_grpc_send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_grpc_close" (func $close (param i32) (result i32)))
  (import "env" "proxy_grpc_cancel" (func $cancel (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_pairs" (func $get_pairs (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_status" (func $get_status (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 0x8000))
  (global $status (export "status") (mut i32) (i32.const -1))
  (global $token (export "token") (mut i32) (i32.const 0))
  (global $cb_ctx (export "cb_ctx") (mut i32) (i32.const 0))
  (global $n_initial (export "n_initial") (mut i32) (i32.const -1))
  (global $n_trailing (export "n_trailing") (mut i32) (i32.const -1))
  (global $map_status (export "map_status") (mut i32) (i32.const -1))
  (global $received (export "received") (mut i32) (i32.const -1))
  (global $close_code (export "close_code") (mut i32) (i32.const -1))
  (global $close_on_close (mut i32) (i32.const 0))
  (global $cancel_on_headers (mut i32) (i32.const 0))
  (global $closed_in_cb (export "closed_in_cb") (mut i32) (i32.const -1))
  (data (i32.const 16) "bridge")
  (data (i32.const 32) "ratelimit.v1.Bridge")
  (data (i32.const 64) "Check")
  (data (i32.const 80) "\01\00\00\00\01\00\00\00\01\00\00\00k\00v\00")
  (data (i32.const 112) "nope")
  (data (i32.const 128) "hello")
  (data (i32.const 136) "world")
  (data (i32.const 400) "7\0arl:a,10,1,6000,1\0a")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32)
    (global.get $heap)
    (global.set $heap (i32.add (global.get $heap) (local.get 0))))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "open") (param $cluster i32) (param $len i32)
    (global.set $status (call $stream (local.get $cluster) (local.get $len)
      (i32.const 32) (i32.const 19) (i32.const 64) (i32.const 5) (i32.const 80) (i32.const 16)
      (i32.const 200)))
    (global.set $token (i32.load (i32.const 200))))
  (func (export "send") (param $token i32) (param $ptr i32) (param $len i32) (param $end i32)
    (global.set $status (call $send (local.get $token) (local.get $ptr) (local.get $len) (local.get $end))))
  (func (export "close") (param i32) (global.set $status (call $close (local.get 0))))
  (func (export "cancel") (param i32) (global.set $status (call $cancel (local.get 0))))
  (func (export "close_on_close") (global.set $close_on_close (i32.const 1)))
  (func (export "cancel_on_headers") (global.set $cancel_on_headers (i32.const 1)))
  (func (export "proxy_on_grpc_receive_initial_metadata") (param $ctx i32) (param $token i32) (param $n i32)
    (global.set $cb_ctx (local.get $ctx))
    (global.set $n_initial (local.get $n))
    (global.set $map_status (call $get_pairs (i32.const 4) (i32.const 240) (i32.const 244)))
    (if (global.get $cancel_on_headers) (then (drop (call $cancel (local.get $token))))))
  (func (export "proxy_on_grpc_receive") (param $ctx i32) (param $token i32) (param $size i32)
    (if (i32.eqz (local.get $size)) (then unreachable))
    (global.set $cb_ctx (local.get $ctx))
    (global.set $received (local.get $size))
    (global.set $status (call $get_buffer (i32.const 5) (i32.const 0) (local.get $size) (i32.const 208) (i32.const 212))))
  (func (export "proxy_on_grpc_receive_trailing_metadata") (param $ctx i32) (param $token i32) (param $n i32)
    (global.set $n_trailing (local.get $n))
    (global.set $map_status (call $get_pairs (i32.const 5) (i32.const 248) (i32.const 252))))
  (func (export "proxy_on_grpc_close") (param $ctx i32) (param $token i32) (param $code i32)
    (global.set $cb_ctx (local.get $ctx))
    (global.set $close_code (local.get $code))
    (global.set $status (call $get_status (i32.const 224) (i32.const 228) (i32.const 232)))
    (if (global.get $close_on_close)
      (then (global.set $closed_in_cb (call $close (local.get $token)))))))"#;
    Wasm::from_bytes(&wat::parse_str(text).unwrap()).unwrap()
}

fn global(host: &mut Host, name: &str) -> i32 {
    host.global_i32(name).unwrap()
}

fn word(host: &Host, at: u32) -> u32 {
    u32::from_le_bytes(host.read_memory(at, 4).unwrap().try_into().unwrap())
}

/// Bytes the host handed over through the guest's allocator: pointer at `at`, size at `at + 4`.
fn handed(host: &Host, at: u32) -> Vec<u8> {
    let (ptr, len) = (word(host, at), word(host, at + 4));
    host.read_memory(ptr, len as usize).unwrap()
}

/// A started host (root context 1) that knows only the cluster "bridge".
fn host() -> Host {
    let state = HostState {
        clusters: Some(vec!["bridge".into()]),
        ..HostState::default()
    };
    let mut host = Host::with_state(&guest(), state).unwrap();
    assert!(host.start(b"").unwrap());
    host
}

/// Opens a stream on "bridge" from `context_id`; its token.
fn open(host: &mut Host, context_id: u32) -> u32 {
    host.call::<(i32, i32), ()>("open", context_id, (16, 6))
        .unwrap();
    assert_eq!(global(host, "status"), 0, "{}", host.log_text());
    global(host, "token") as u32
}

/// Sends the 5 bytes at `ptr` ("hello" 128, "world" 136); the status.
fn send(host: &mut Host, token: u32, ptr: i32, end_stream: bool) -> i32 {
    let params = (token as i32, ptr, 5, i32::from(end_stream));
    host.call::<(i32, i32, i32, i32), ()>("send", 1, params)
        .unwrap();
    global(host, "status")
}

fn close(host: &mut Host, token: u32, how: &'static str) -> i32 {
    host.call::<i32, ()>(how, 1, token as i32).unwrap();
    global(host, "status")
}

#[test]
fn opening_returns_a_stream_token_and_records_the_request_unknown_clusters_fail_to_parse() {
    let mut host = host();
    let token = open(&mut host, 1);
    assert_eq!(token % 4, 2, "Envoy's stream tokens are 2 mod 4");
    let stream = host.grpc_stream(token).unwrap();
    let asked = [&stream.upstream, &stream.service, &stream.method];
    assert_eq!(asked, ["bridge", "ratelimit.v1.Bridge", "Check"]);
    assert_eq!(stream.context_id, 1);
    assert_eq!(stream.initial_metadata, pairs(&[("k", "v")]));
    assert!(stream.writable() && stream.messages.is_empty());
    assert_ne!(open(&mut host, 1), token, "a fresh token each time");
    host.call::<(i32, i32), ()>("open", 1, (112, 4)).unwrap();
    assert_eq!(global(&mut host, "status"), 4, "ParseFailure");
    assert_eq!(host.grpc_streams().len(), 2);
}

#[test]
fn sends_are_recorded_in_order_and_unknown_tokens_are_refused() {
    let mut host = host();
    let token = open(&mut host, 1);
    assert_eq!(send(&mut host, token, 128, false), 0);
    assert_eq!(send(&mut host, token, 136, false), 0);
    assert_eq!(
        host.grpc_stream(token).unwrap().messages_text(),
        ["hello", "world"]
    );
    assert_eq!(send(&mut host, token + 4, 128, false), 1, "NotFound");
    assert_eq!(
        send(&mut host, 5, 128, false),
        2,
        "a gRPC call token: BadArgument"
    );
    assert_eq!(close(&mut host, token + 4, "close"), 1);
    assert_eq!(close(&mut host, token + 4, "cancel"), 1);
    // A cancelled stream is gone at once.
    assert_eq!(close(&mut host, token, "cancel"), 0);
    assert_eq!(send(&mut host, token, 128, false), 1);
    assert_eq!(close(&mut host, token, "close"), 1);
    assert!(
        host.grpc_message(token, b"late").is_err(),
        "no callback after a reset"
    );
}

#[test]
fn a_message_reaches_the_root_context_whoever_opened_the_stream_via_buffer_5() {
    let mut host = host();
    let http = host.new_stream().unwrap();
    let token = open(&mut host, http);
    assert_eq!(host.grpc_stream_of(http).unwrap().token, token);
    let message = b"7\n\x00binary\xff\n";
    host.grpc_message(token, message).unwrap();
    assert_eq!(global(&mut host, "cb_ctx"), 1, "the root context's id");
    assert_eq!(
        global(&mut host, "n_initial"),
        2,
        "response headers came first"
    );
    assert_eq!(global(&mut host, "map_status"), 0);
    assert_eq!(
        decode_pairs(&handed(&host, 240)).unwrap(),
        pairs(&[(":status", "200"), ("content-type", "application/grpc")])
    );
    assert_eq!(global(&mut host, "received"), message.len() as i32);
    assert_eq!(global(&mut host, "status"), 0);
    assert_eq!(handed(&host, 208), message);
    host.grpc_message(token, b"second").unwrap();
    assert_eq!(handed(&host, 208), b"second");
    let callbacks: Vec<(&str, u32)> = host
        .state()
        .fuel
        .iter()
        .filter(|f| f.callback.starts_with("proxy_on_grpc"))
        .map(|f| (f.callback, f.context_id))
        .collect();
    assert_eq!(
        callbacks,
        [
            ("proxy_on_grpc_receive_initial_metadata", 1),
            ("proxy_on_grpc_receive", 1),
            ("proxy_on_grpc_receive", 1)
        ]
    );
    // Outside the callbacks neither the buffer nor the map exists.
    assert!(host.state().grpc.receive.is_none() && host.state().grpc.initial_metadata.is_none());
}

#[test]
fn a_remote_close_delivers_trailers_and_status_and_the_token_lives_until_the_guest_closes_it() {
    let mut host = host();
    let token = open(&mut host, 1);
    host.grpc_message(token, b"x").unwrap();
    host.grpc_remote_close(token, 14, "bridge down").unwrap();
    assert_eq!(global(&mut host, "cb_ctx"), 1);
    assert_eq!(global(&mut host, "n_trailing"), 2);
    assert_eq!(
        decode_pairs(&handed(&host, 248)).unwrap(),
        pairs(&[("grpc-status", "14"), ("grpc-message", "bridge down")])
    );
    assert_eq!(global(&mut host, "close_code"), 14);
    assert_eq!(global(&mut host, "status"), 0, "proxy_get_status");
    assert_eq!(word(&host, 224), 14);
    assert_eq!(handed(&host, 228), b"bridge down");
    assert_eq!(
        host.state().last_status,
        (0, Vec::new()),
        "only during the callback"
    );
    assert!(
        host.grpc_message(token, b"y").is_err(),
        "nothing after the close"
    );
    // Envoy keeps the dead token until the guest closes it: sends are Ok and go nowhere.
    assert!(host.grpc_stream(token).unwrap().leaked());
    assert_eq!(send(&mut host, token, 128, false), 0);
    assert_eq!(
        host.grpc_stream(token).unwrap().dropped,
        [b"hello".to_vec()]
    );
    assert_eq!(close(&mut host, token, "close"), 0);
    assert!(!host.grpc_stream(token).unwrap().leaked());
    assert_eq!(
        send(&mut host, token, 128, false),
        1,
        "NotFound once closed"
    );
    assert_eq!(close(&mut host, token, "close"), 1);
}

#[test]
fn a_close_before_any_message_is_trailers_only_and_closing_in_the_callback_frees_the_token() {
    let mut host = host();
    let token = open(&mut host, 1);
    host.call::<(), ()>("close_on_close", 1, ()).unwrap();
    host.grpc_remote_close(token, 0, "").unwrap();
    assert_eq!(global(&mut host, "n_initial"), 0, "empty initial metadata");
    assert_eq!(global(&mut host, "n_trailing"), 3);
    assert_eq!(
        decode_pairs(&handed(&host, 248)).unwrap(),
        pairs(&[
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", "0")
        ])
    );
    assert_eq!(global(&mut host, "close_code"), 0);
    assert_eq!(
        word(&host, 228),
        0,
        "an empty status message is a null pointer"
    );
    assert_eq!(global(&mut host, "closed_in_cb"), 0);
    assert!(!host.grpc_stream(token).unwrap().held());
    assert_eq!(send(&mut host, token, 128, false), 1);
}

#[test]
fn after_a_half_close_the_upstream_still_answers_and_closes() {
    let mut host = host();
    let token = open(&mut host, 1);
    assert_eq!(send(&mut host, token, 128, true), 0, "end_stream");
    assert_eq!(send(&mut host, token, 136, false), 0);
    let stream = host.grpc_stream(token).unwrap();
    assert_eq!(
        (stream.messages_text(), stream.dropped.len()),
        (vec!["hello".to_string()], 1)
    );
    assert_eq!(close(&mut host, token, "close"), 0);
    host.grpc_message(token, b"answer").unwrap();
    assert_eq!(handed(&host, 208), b"answer");
    host.grpc_remote_close(token, 0, "").unwrap();
    assert_eq!(global(&mut host, "close_code"), 0);
    assert!(!host.grpc_stream(token).unwrap().held(), "both ends closed");
    assert_eq!(send(&mut host, token, 128, false), 1);
}

#[test]
fn a_cancel_in_a_callback_stops_delivery_and_a_trap_in_one_fails_the_vm() {
    let mut host = host();
    let token = open(&mut host, 1);
    host.call::<(), ()>("cancel_on_headers", 1, ()).unwrap();
    host.grpc_message(token, b"never read").unwrap();
    assert_eq!(global(&mut host, "n_initial"), 2);
    assert_eq!(
        global(&mut host, "received"),
        -1,
        "reset before the message"
    );
    assert!(host.grpc_stream(token).unwrap().guest_cancelled);

    let mut host = self::host();
    let token = open(&mut host, 1);
    // The guest traps on an empty message: the error names the callback, as for any other.
    let error = host.grpc_message(token, b"").unwrap_err().to_string();
    assert!(error.contains("proxy_on_grpc_receive"), "{error}");
    assert!(host.state().grpc.receive.is_none());
    assert!(
        host.grpc_remote_close(token, 0, "").is_err(),
        "the VM has failed"
    );
}

/// Answers one HTTP/1.1 request per reply in `replies`, returning the requests.
fn bridge(replies: Vec<Vec<u8>>) -> (SocketAddr, JoinHandle<Vec<String>>) {
    let (addr, requests) = test_support::scripted_http(replies);
    let text = std::thread::spawn(move || {
        let requests = requests.join().unwrap();
        requests
            .into_iter()
            .map(|r| String::from_utf8(r).unwrap())
            .collect()
    });
    (addr, text)
}

fn http_reply(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn live_mode_posts_each_batch_and_answers_on_the_stream_until_the_bridge_fails() {
    let mut host = host();
    let token = open(&mut host, 1);
    let (addr, requests) = bridge(vec![
        http_reply("200 OK", "1767225600000 1,9,6000,0\n"),
        http_reply("503 Service Unavailable", "no redis"),
    ]);
    let send_batch = |host: &mut Host, token: u32| {
        let batch = (token as i32, 400, 19, 0);
        host.call::<(i32, i32, i32, i32), ()>("send", 1, batch)
            .unwrap();
    };
    send_batch(&mut host, token);
    assert_eq!(host.forward_grpc(token, addr).unwrap(), 1);
    assert_eq!(handed(&host, 208), b"7\n1767225600000 1,9,6000,0\n");
    assert_eq!(
        host.forward_grpc(token, addr).unwrap(),
        0,
        "nothing new to send"
    );
    send_batch(&mut host, token);
    assert_eq!(host.forward_grpc(token, addr).unwrap(), 0);
    assert_eq!(global(&mut host, "close_code"), 14, "UNAVAILABLE");
    assert!(String::from_utf8(handed(&host, 228))
        .unwrap()
        .contains("503"));
    let requests = requests.join().unwrap();
    assert!(
        requests[0].starts_with("POST /v1/check HTTP/1.1\r\nhost: bridge\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].ends_with("\r\n\r\nrl:a,10,1,6000,1\n"),
        "the id line stays on the stream: {}",
        requests[0]
    );
    // An unreachable bridge closes a fresh stream the same way.
    let token = open(&mut host, 1);
    send_batch(&mut host, token);
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert_eq!(host.forward_grpc(token, closed).unwrap(), 0);
    let stream = host.grpc_stream(token).unwrap();
    assert!(matches!(stream.remote_close, Some((14, _))), "{stream:?}");
}
