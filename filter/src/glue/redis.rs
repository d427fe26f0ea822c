//! Higress's redis call, the transport of the redis-call build (`--features redis-call`,
//! `dist/ratelimit-redis.wasm`): an exchange is one script call on Redis, sent by the root,
//! and its reply settles the exchange as a reply from the bridge would.
//!
//! The host delivers replies through an export of its own, `proxy_on_redis_call_response`,
//! which the SDK's dispatcher does not know: it finds the root's dispatcher by the context
//! id the host names.

use super::abi;
use super::executor::run;
use crate::worker::dispatch::Dispatcher;
use hashbrown::HashMap;
use ratelimit_config::backend::Backend;
use ratelimit_protocol::MAX_REPLY_LEN;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

/// A root's dispatcher and its wake-up queue.
type Root = (Weak<RefCell<Dispatcher>>, Option<u32>);

thread_local! {
    /// Each root's dispatcher by its context id, for the replies the host delivers.
    static ROOTS: RefCell<HashMap<u32, Root>> = RefCell::new(HashMap::new());
}

/// Declares the Redis service to the host (once per configuration; it logs in with the
/// configured user and password) and lets replies find `dispatcher`. Call from
/// `on_configure`.
pub(super) fn init(
    root: u32,
    dispatcher: &Rc<RefCell<Dispatcher>>,
    queue: Option<u32>,
    backend: &Backend,
) -> Result<(), String> {
    let (username, password) = match &backend.login {
        Some(login) => (login.username.as_str(), login.password.expose()),
        None => ("", ""),
    };
    let timeout = u32::try_from(backend.timeout_ms).unwrap_or(u32::MAX);
    let status = abi::redis_init(&backend.cluster, username, password, timeout);
    if status != 0 {
        let cluster = &backend.cluster;
        return Err(format!(
            "proxy_redis_init on {cluster:?} failed (status {status})"
        ));
    }
    ROOTS.with(|roots| match roots.try_borrow_mut() {
        Ok(mut roots) => {
            roots.insert(root, (Rc::downgrade(dispatcher), queue));
            Ok(())
        }
        Err(_) => Err("the table of roots is busy".to_string()),
    })
}

/// The host's callback for a finished redis call.
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(
    root_context_id: u32,
    token: u32,
    status: u32,
    response_size: usize,
) {
    let root = ROOTS.with(|roots| {
        let roots = roots.try_borrow().ok()?;
        let (dispatcher, queue) = roots.get(&root_context_id)?;
        Some((dispatcher.upgrade()?, *queue))
    });
    let Some((dispatcher, queue)) = root else {
        return;
    };
    let reply = match status {
        0 => abi::redis_reply(response_size.min(MAX_REPLY_LEN + 1)),
        _ => Vec::new(),
    };
    run(&dispatcher, queue, None, |d, host, link| {
        ((), d.redis_reply(token, status, &reply, host, link))
    });
}
