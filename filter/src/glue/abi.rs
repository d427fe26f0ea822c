//! The host calls the glue makes, on the raw ABI: every status handled, none unwrapped.
//!
//! The SDK's wrappers panic on a status they do not expect, and a panic kills the VM and
//! every request of its worker; hosts differ in what they answer (a local reply after the
//! stream is gone, a call a host does not implement). Only two SDK wrappers stay, because
//! the SDK must learn their token to route the answers: `dispatch_http_call` (it handles
//! BadArgument and InternalFailure, what Envoy answers) and `open_grpc_stream`.
//!
//! The per-request calls (headers, the clock) also skip the SDK's copies: they run on
//! every request. Every host function the filter imports is declared here.

use crate::host::header_map::{self, HeaderMap};
use proxy_wasm::types::{BufferType, MapType, MetricType, Status, StreamType};
use std::ptr::null_mut;
use std::time::Duration;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_pairs(
        map_type: MapType,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> Status;
    fn proxy_get_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> Status;
    fn proxy_add_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> Status;
    fn proxy_replace_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> Status;
    fn proxy_remove_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
    ) -> Status;
    fn proxy_set_buffer_bytes(
        buffer_type: BufferType,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> Status;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> Status;
    // The buffer type as a number: Higress's redis reply (9) is none of the SDK's.
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> Status;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> Status;
    fn proxy_set_tick_period_milliseconds(period: u32) -> Status;
    fn proxy_set_effective_context(context_id: u32) -> Status;
    fn proxy_continue_stream(stream_type: StreamType) -> Status;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> Status;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> Status;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> Status;
    fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> Status;
    fn proxy_define_metric(
        metric_type: MetricType,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> Status;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> Status;
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

// Higress's redis call, which only the redis-call build imports: stock Envoy refuses a
// module that imports a host function it lacks.
#[cfg(feature = "redis-call")]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_redis_init(
        cluster_ptr: *const u8,
        cluster_len: usize,
        username_ptr: *const u8,
        username_len: usize,
        password_ptr: *const u8,
        password_len: usize,
        timeout_ms: u32,
    ) -> u32;
    fn proxy_redis_call(
        cluster_ptr: *const u8,
        cluster_len: usize,
        query_ptr: *const u8,
        query_len: usize,
        token: *mut u32,
    ) -> u32;
}

/// Runs a host call that hands back bytes it allocated in the guest, and takes ownership
/// of them: `None` for any status but Ok, or no bytes.
fn host_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> Status) -> Option<Vec<u8>> {
    let mut data: *mut u8 = null_mut();
    let mut size = 0;
    if call(&mut data, &mut size) != Status::Ok || data.is_null() {
        return None;
    }
    // SAFETY: the host wrote a buffer of `size` initialized bytes that it allocated through
    // the SDK's allocator (a `Vec` of that capacity); the `Vec` takes ownership of it, as
    // the SDK itself does.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// The current request's headers, all values of each (empty if the host has none to give).
pub fn request_headers() -> HeaderMap {
    // SAFETY: the out-pointers come from `host_bytes` and outlive the call.
    let bytes = host_bytes(|data, size| unsafe {
        proxy_get_header_map_pairs(MapType::HttpRequestHeaders, data, size)
    });
    HeaderMap::new(bytes.unwrap_or_default())
}

/// A header of the callout reply being delivered (`:status`, say), or of the current
/// request's response: `map` says which.
pub fn header_value(map: MapType, name: &str) -> Option<Vec<u8>> {
    // SAFETY: the pointer and length describe `name`; the out-pointers come from
    // `host_bytes` and outlive the call.
    host_bytes(|data, size| unsafe {
        proxy_get_header_map_value(map, name.as_ptr(), name.len(), data, size)
    })
}

/// Adds a header to the response on its way back.
pub fn add_response_header(name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe `name` and `value`, alive across the call.
    let status = unsafe {
        proxy_add_header_map_value(
            MapType::HttpResponseHeaders,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    ok(status)
}

/// Sets a request header on its way upstream, replacing any copies of it.
pub fn replace_request_header(name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe `name` and `value`, alive across the call.
    let status = unsafe {
        proxy_replace_header_map_value(
            MapType::HttpRequestHeaders,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    ok(status)
}

/// Removes a request header on its way upstream, every copy of it.
pub fn remove_request_header(name: &str) -> Result<(), Status> {
    // SAFETY: the pointer and length describe `name`, alive across the call.
    let status = unsafe {
        proxy_remove_header_map_value(MapType::HttpRequestHeaders, name.as_ptr(), name.len())
    };
    ok(status)
}

/// Replaces the first `size` bytes of a buffer the host holds (all of it, for Envoy's
/// request body: it replaces a whole buffer or adds to either end) with `data`.
pub fn replace_buffer(buffer_type: BufferType, size: usize, data: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointer and length describe `data`, alive across the call.
    let status = unsafe { proxy_set_buffer_bytes(buffer_type, 0, size, data.as_ptr(), data.len()) };
    ok(status)
}

/// A host property, e.g. `["source", "address"]`.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let serialized = path.join("\0");
    // SAFETY: the pointer and length describe `serialized`; the out-pointers come from
    // `host_bytes` and outlive the call.
    host_bytes(|data, size| unsafe {
        proxy_get_property(serialized.as_ptr(), serialized.len(), data, size)
    })
}

/// Up to `max` bytes of a buffer (the plugin configuration, a reply's body).
pub fn buffer(buffer_type: BufferType, max: usize) -> Option<Vec<u8>> {
    buffer_at(buffer_type as u32, 0, max)
}

fn buffer_at(buffer_type: u32, start: usize, max: usize) -> Option<Vec<u8>> {
    // SAFETY: the out-pointers come from `host_bytes` and outlive the call.
    host_bytes(|data, size| unsafe { proxy_get_buffer_bytes(buffer_type, start, max, data, size) })
}

/// A buffer whole (a request body the host buffered), handed to `each` a slice at a time
/// so that the filter never copies more than one slice of it at once.
pub fn each_slice(buffer_type: BufferType, mut each: impl FnMut(&[u8])) {
    const SLICE: usize = 16 * 1024;
    let mut start = 0;
    while let Some(slice) = buffer_at(buffer_type as u32, start, SLICE) {
        each(&slice);
        start += slice.len();
        if slice.len() < SLICE {
            break;
        }
    }
}

/// Sends a message on gRPC stream `token` (the SDK's wrapper panics on a status it does
/// not expect).
pub fn grpc_send(token: u32, message: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointer and length describe `message`, alive across the call.
    ok(unsafe { proxy_grpc_send(token, message.as_ptr(), message.len(), false) })
}

/// Closes gRPC stream `token`; one the host already closed answers NotFound.
pub fn grpc_close(token: u32) -> Result<(), Status> {
    // SAFETY: a plain host call with an integer argument.
    ok(unsafe { proxy_grpc_close(token) })
}

/// Registers the shared queue `name`; its id.
pub fn register_queue(name: &str) -> Option<u32> {
    let mut id = 0;
    // SAFETY: the pointer and length describe `name`; `id` outlives the call.
    let status = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    ok(status).ok().map(|()| id)
}

/// Posts `item` to shared queue `queue`.
pub fn enqueue(queue: u32, item: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointer and length describe `item`, alive across the call.
    ok(unsafe { proxy_enqueue_shared_queue(queue, item.as_ptr(), item.len()) })
}

/// Declares the Redis service `cluster` to the host, logging in as `username`.
#[cfg(feature = "redis-call")]
pub fn redis_init(cluster: &str, username: &str, password: &str, timeout_ms: u32) -> u32 {
    // SAFETY: each pointer and length describes a live string for the call's duration.
    unsafe {
        proxy_redis_init(
            cluster.as_ptr(),
            cluster.len(),
            username.as_ptr(),
            username.len(),
            password.as_ptr(),
            password.len(),
            timeout_ms,
        )
    }
}

/// Sends `query` (RESP) to the Redis service `cluster`: the call's token, or the status.
#[cfg(feature = "redis-call")]
pub fn redis_call(cluster: &str, query: &[u8]) -> Result<u32, u32> {
    let mut token = 0;
    // SAFETY: the pointers and lengths describe `cluster` and `query`; `token` outlives
    // the call.
    let status = unsafe {
        proxy_redis_call(
            cluster.as_ptr(),
            cluster.len(),
            query.as_ptr(),
            query.len(),
            &mut token,
        )
    };
    if status != 0 {
        return Err(status);
    }
    Ok(token)
}

/// Up to `max` bytes of the redis reply being delivered (Higress's buffer type 9).
#[cfg(feature = "redis-call")]
pub fn redis_reply(max: usize) -> Vec<u8> {
    buffer_at(9, 0, max).unwrap_or_default()
}

/// Milliseconds since the Unix epoch by the host's clock; 0 if the host will not tell.
pub fn now_ms() -> u64 {
    let mut nanos = 0;
    // SAFETY: `nanos` outlives the call.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut nanos) };
    match status {
        Status::Ok => nanos / 1_000_000,
        _ => 0,
    }
}

pub fn set_tick_period(period: Duration) -> Result<(), Status> {
    let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
    // SAFETY: a plain host call with an integer argument.
    ok(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Makes `context_id` the context later calls act on; fails for a context that is gone.
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: a plain host call with an integer argument.
    ok(unsafe { proxy_set_effective_context(context_id) })
}

/// Lets the current (paused) request go on.
pub fn resume_request() -> Result<(), Status> {
    // SAFETY: a plain host call with an integer argument.
    ok(unsafe { proxy_continue_stream(StreamType::HttpRequest) })
}

/// Answers the current request with a local reply.
pub fn send_local_reply<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    status: u32,
    headers: &[(K, V)],
    body: &[u8],
) -> Result<(), Status> {
    let headers = header_map::serialize(headers);
    // SAFETY: the pointers and lengths describe `body` and `headers`, alive across the
    // call; no details (null, 0).
    let status = unsafe {
        proxy_send_local_response(
            status,
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    };
    ok(status)
}

/// Shared data `key`: its value and version (CAS token), `None` if absent or refused.
pub fn shared_data(key: &str) -> Option<(Vec<u8>, u32)> {
    let mut cas = 0;
    // SAFETY: the pointer and length describe `key`; `cas` and the out-pointers from
    // `host_bytes` outlive the call.
    let value = host_bytes(|data, size| unsafe {
        proxy_get_shared_data(key.as_ptr(), key.len(), data, size, &mut cas)
    })?;
    Some((value, cas))
}

/// Stores shared data `key` if it is still at version `cas` (0: unconditionally).
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe `key` and `value`, alive across the call.
    ok(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) })
}

/// Takes the next item of a shared queue; `None` when empty, gone or refused.
pub fn dequeue(queue: u32) -> Option<Vec<u8>> {
    // SAFETY: the out-pointers come from `host_bytes` and outlive the call.
    host_bytes(|data, size| unsafe { proxy_dequeue_shared_queue(queue, data, size) })
}

/// Defines a counter (the host hands back the existing one for a name it knows).
pub fn define_counter(name: &str) -> Option<u32> {
    let mut id = 0;
    // SAFETY: the pointer and length describe `name`; `id` outlives the call.
    let status =
        unsafe { proxy_define_metric(MetricType::Counter, name.as_ptr(), name.len(), &mut id) };
    ok(status).ok().map(|()| id)
}

pub fn increment_metric(id: u32, by: i64) -> Result<(), Status> {
    // SAFETY: a plain host call with integer arguments.
    ok(unsafe { proxy_increment_metric(id, by) })
}

fn ok(status: Status) -> Result<(), Status> {
    match status {
        Status::Ok => Ok(()),
        status => Err(status),
    }
}
