//! Higress's redis call, the transport of the redis-call build (`--features redis-call`,
//! `dist/ratelimit-redis.wasm`): an exchange is one script call on Redis, sent by the root,
//! and its reply settles the exchange as a reply from the bridge would. The host functions
//! are `redis_host`'s.
//!
//! The host delivers replies through an export of its own, `proxy_on_redis_call_response`,
//! which the SDK's dispatcher does not know: it finds the root's hub by the context id the
//! host names.

use super::hub::{carry_out_all, Hub};
use super::redis_host;
use crate::redis_call::{decode_reply, is_noscript, Invoke};
use hashbrown::HashMap;
use ratelimit_config::backend::Backend;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

thread_local! {
    /// Each root's hub by its context id, for the replies the host delivers.
    static HUBS: RefCell<HashMap<u32, Weak<Hub>>> = RefCell::new(HashMap::new());
}

/// Declares the Redis service to the host (once per configuration) and lets replies find
/// `hub`. Call from `on_configure`.
pub(super) fn init(root: u32, hub: &Rc<Hub>, backend: &Backend) -> Result<(), String> {
    redis_host::declare(backend)?;
    HUBS.with(|hubs| {
        if let Ok(mut hubs) = hubs.try_borrow_mut() {
            hubs.insert(root, Rc::downgrade(hub));
        }
    });
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
        redis_host::reply(response_size)
    } else {
        Vec::new()
    };
    if status == 0 && is_noscript(&reply) && sent.invoke == Invoke::Sha {
        log::info!("redis lost the token bucket script; sending it again");
        let backend = &shared.config.backend;
        match redis_host::send(&hub.redis_calls, backend, sent.id, sent.body, Invoke::Text) {
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
