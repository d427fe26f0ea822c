//! Higress's redis-call host functions, which only the redis-call build imports (stock
//! Envoy refuses a module that imports a host function it lacks): declaring the Redis
//! service, sending a script call, reading its reply. Below the hub, which sends through
//! them; `redis` routes the replies back up to it.

use crate::redis_call::{script_query, Invoke};
use hashbrown::HashMap;
use ratelimit_config::backend::Backend;
use ratelimit_protocol::MAX_REPLY_LEN;
use std::cell::RefCell;

/// Higress's buffer type of the redis reply being delivered.
const REDIS_CALL_RESPONSE: u32 = 9;

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
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
}

/// A script call in flight: its exchange, and the batch to send again as `EVAL` if Redis
/// has lost the script.
pub(super) struct Sent {
    pub(super) id: u32,
    pub(super) body: String,
    pub(super) invoke: Invoke,
}

/// Declares the Redis service to the host (once per configuration; it logs in with the
/// configured user and password).
pub(super) fn declare(backend: &Backend) -> Result<(), String> {
    let (username, password) = match &backend.login {
        Some(login) => (login.username.as_str(), login.password.expose()),
        None => ("", ""),
    };
    let timeout = u32::try_from(backend.timeout_ms).unwrap_or(u32::MAX);
    let cluster = &backend.cluster;
    // SAFETY: each pointer and length describes a live string for the call's duration.
    let status = unsafe {
        proxy_redis_init(
            cluster.as_ptr(),
            cluster.len(),
            username.as_ptr(),
            username.len(),
            password.as_ptr(),
            password.len(),
            timeout,
        )
    };
    if status != 0 {
        return Err(format!(
            "proxy_redis_init on {cluster:?} failed (status {status})"
        ));
    }
    Ok(())
}

/// Sends exchange `id` (its batch `body`) as one script call, remembered in `calls` by
/// the token its reply will carry.
pub(super) fn send(
    calls: &RefCell<HashMap<u32, Sent>>,
    backend: &Backend,
    id: u32,
    body: String,
    invoke: Invoke,
) -> Result<(), String> {
    let query = script_query(&body, invoke)?;
    let cluster = &backend.cluster;
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
        return Err(format!("proxy_redis_call failed (status {status})"));
    }
    if let Ok(mut calls) = calls.try_borrow_mut() {
        calls.insert(token, Sent { id, body, invoke });
    }
    Ok(())
}

/// The reply being delivered, bounded: anything longer is no reply to a script call.
pub(super) fn reply(size: usize) -> Vec<u8> {
    let size = size.min(MAX_REPLY_LEN + 1);
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut len = 0;
    // SAFETY: the host writes a buffer it allocated through the SDK's allocator (a `Vec`
    // of `len` bytes), which the `Vec` below takes ownership of, as the SDK itself does.
    let status =
        unsafe { proxy_get_buffer_bytes(REDIS_CALL_RESPONSE, 0, size, &mut data, &mut len) };
    if status != 0 || data.is_null() {
        return Vec::new();
    }
    // SAFETY: see above; `data` is non-null and holds `len` initialized bytes.
    unsafe { Vec::from_raw_parts(data, len, len) }
}
