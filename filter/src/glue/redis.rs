//! Higress's redis call, the transport of the redis-call build (`--features redis-call`,
//! `dist/ratelimit-redis.wasm`): an exchange is one script call on Redis, sent by the root,
//! and its reply settles the exchange as a reply from the bridge would. The imports exist
//! only in this build: stock Envoy refuses a module that imports a host function it lacks.
//!
//! The host delivers replies through an export of its own, `proxy_on_redis_call_response`,
//! which the SDK's dispatcher does not know: it finds the root's hub by the context id the
//! host names.

use super::hub::{carry_out_all, Hub};
use crate::backend::Backend;
use crate::redis_call::{decode_reply, is_noscript, script_query, Invoke};
use hashbrown::HashMap;
use ratelimit_protocol::MAX_REPLY_LEN;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

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
    id: u32,
    body: String,
    invoke: Invoke,
}

thread_local! {
    /// Each root's hub by its context id, for the replies the host delivers.
    static HUBS: RefCell<HashMap<u32, Weak<Hub>>> = RefCell::new(HashMap::new());
}

/// Declares the Redis service to the host (once per configuration; it logs in with the
/// configured user and password) and lets replies find `hub`. Call from `on_configure`.
pub(super) fn init(root: u32, hub: &Rc<Hub>, backend: &Backend) -> Result<(), String> {
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
    HUBS.with(|hubs| {
        if let Ok(mut hubs) = hubs.try_borrow_mut() {
            hubs.insert(root, Rc::downgrade(hub));
        }
    });
    Ok(())
}

/// Sends exchange `id` (its batch `body`) as one script call, remembered in `hub`.
pub(super) fn send(
    hub: &Hub,
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
    if let Ok(mut calls) = hub.redis_calls.try_borrow_mut() {
        calls.insert(token, Sent { id, body, invoke });
    }
    Ok(())
}

/// Forgets the calls of exchanges given up (timed out): a reply that never comes must not
/// keep its batch forever.
pub(super) fn forget_given_up(hub: &Hub) {
    let (Ok(mut calls), Ok(exchanges)) =
        (hub.redis_calls.try_borrow_mut(), hub.exchanges.try_borrow())
    else {
        return;
    };
    calls.retain(|_, sent| exchanges.in_flight(sent.id));
}

/// The reply being delivered, bounded: anything longer is no reply to a script call.
fn reply(size: usize) -> Vec<u8> {
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

/// The host's callback for a finished redis call: settles its exchange from the reply, or
/// sends the batch once more as `EVAL` when Redis answers that it lost the script.
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(
    root_context_id: u32,
    token: u32,
    status: u32,
    response_size: usize,
) {
    let hub = HUBS.with(|hubs| {
        let hubs = hubs.try_borrow().ok()?;
        hubs.get(&root_context_id).and_then(Weak::upgrade)
    });
    let Some(hub) = hub else {
        return;
    };
    let sent = hub
        .redis_calls
        .try_borrow_mut()
        .ok()
        .and_then(|mut calls| calls.remove(&token));
    let (Some(sent), Some(shared)) = (sent, hub.shared()) else {
        return; // given up already, or never ours
    };
    let reply = if status == 0 {
        reply(response_size)
    } else {
        Vec::new()
    };
    if status == 0 && is_noscript(&reply) && sent.invoke == Invoke::Sha {
        log::info!("redis lost the token bucket script; sending it again");
        let backend = &shared.config.backend;
        match send(&hub, backend, sent.id, sent.body, Invoke::Text) {
            Ok(()) => return,
            Err(e) => {
                carry_out_all(&hub.fail(&shared, sent.id, e));
                return hub.pump_from_root(&shared);
            }
        }
    }
    hub.answered(sent.id, |counts| {
        if status != 0 {
            return Err(format!("redis call failed (status {status})"));
        }
        decode_reply(&reply, counts)
    });
}
