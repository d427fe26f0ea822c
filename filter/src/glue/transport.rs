//! Getting an exchange to the bridge and its reply back, over either transport: an HTTP
//! callout per exchange, or a message on the worker's long-lived gRPC stream. (Redis
//! itself, in the redis-call build, is `redis`.)
//!
//! Sending and closing on the stream call the ABI directly: the SDK's wrappers panic on a
//! status they do not expect, and a panic would kill the VM and every request of its
//! worker. Opening goes through the SDK, which must learn the token to route the replies.

use super::abi;
use crate::protocol::{self, GRPC_METHOD, GRPC_SERVICE, MAX_REPLY_LEN};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Status};
use ratelimit_config::backend::{Backend, Transport};
use ratelimit_protocol::MAX_ID_LINE;
use std::time::Duration;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_grpc_send(
        token: u32,
        message_ptr: *const u8,
        message_len: usize,
        end_stream: bool,
    ) -> Status;
    fn proxy_grpc_close(token_id: u32) -> Status;
    fn proxy_register_shared_queue(
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> Status;
    fn proxy_enqueue_shared_queue(
        queue_id: u32,
        value_data: *const u8,
        value_size: usize,
    ) -> Status;
}

/// Sends exchange `id`. An HTTP callout's token comes back: its reply goes to the context
/// running now. A stream message's reply always goes to the root, which owns the stream.
pub fn send(
    backend: &Backend,
    stream: Option<u32>,
    id: u32,
    body: &str,
) -> Result<Option<u32>, String> {
    match backend.transport {
        Transport::Grpc => {
            let token = stream.ok_or("no stream to the bridge (reconnecting)")?;
            let message = protocol::stream_message(id, body);
            // SAFETY: the pointer and length describe `message`, alive across the call.
            let status = unsafe { proxy_grpc_send(token, message.as_ptr(), message.len(), false) };
            match status {
                Status::Ok => Ok(None),
                status => Err(format!("stream send failed: {status:?}")),
            }
        }
        Transport::Http => dispatch(backend, body).map(Some),
        // The redis-call build sends these itself (`Hub::send`); this build refuses such a
        // configuration before any check.
        Transport::Redis => Err("this build has no redis call".into()),
    }
}

fn dispatch(backend: &Backend, body: &str) -> Result<u32, String> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", protocol::PATH),
        (":authority", backend.authority.as_str()),
        ("content-type", "text/plain"),
    ];
    if let Some(authorization) = &backend.authorization {
        headers.push(("authorization", authorization.expose()));
    }
    let timeout = Duration::from_millis(backend.timeout_ms);
    hostcalls::dispatch_http_call(
        &backend.cluster,
        headers,
        Some(body.as_bytes()),
        vec![],
        timeout,
    )
    .map_err(|e| format!("dispatch failed: {e:?}"))
}

/// Opens the worker's stream to the bridge; call from a root callback only.
pub fn open_stream(backend: &Backend) -> Result<u32, String> {
    let metadata = match &backend.authorization {
        Some(authorization) => vec![("authorization", authorization.expose().as_bytes())],
        None => vec![],
    };
    hostcalls::open_grpc_stream(&backend.cluster, GRPC_SERVICE, GRPC_METHOD, metadata)
        .map_err(|e| format!("cannot open a gRPC stream on {:?}: {e:?}", backend.cluster))
}

/// Closes a stream; one the host already closed answers NotFound, which is fine.
pub fn close_stream(token: u32) {
    // SAFETY: a plain host call with an integer argument.
    let _ = unsafe { proxy_grpc_close(token) };
}

/// Registers this worker's wake-up queue: a shared queue whose name no other worker uses,
/// since the host notifies only the last context to register a name. Call from a root
/// callback. `None` where the host has no shared queues: the caller wakes with a tick.
pub fn register_wake_queue() -> Option<u32> {
    use std::hash::{BuildHasher, Hasher};
    let unique = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let name = format!("ratelimit.wake.{unique:016x}");
    let mut id = 0;
    // SAFETY: the pointer and length describe `name`; `id` outlives the call.
    let status = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    (status == Status::Ok).then_some(id)
}

/// Posts to the wake-up queue: the host calls the root's `on_queue_ready` from its event
/// loop, right after the current callback.
pub fn post(queue: u32) -> bool {
    // SAFETY: a one-byte static buffer.
    let status = unsafe { proxy_enqueue_shared_queue(queue, b"w".as_ptr(), 1) };
    status == Status::Ok
}

/// Empties the wake-up queue (each post left an item).
pub fn drain(queue: u32) {
    while abi::dequeue(queue).is_some() {}
}

/// The stream message being delivered, bounded: anything longer is garbage anyway.
pub fn stream_message(size: usize) -> Vec<u8> {
    let size = size.min(MAX_ID_LINE + MAX_REPLY_LEN + 1);
    abi::buffer(BufferType::GrpcReceiveBuffer, size).unwrap_or_default()
}
