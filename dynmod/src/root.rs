//! A configuration's state on one worker (its root, as the wasm filter's root context is):
//! its dispatcher, behind a mutex because Envoy's main thread ticks it too
//! (`worker::tick_all`), its tick, its mailbox and its callout tokens; and every root of a
//! configuration, across workers, for that tick.

use crate::config::FilterConfig;
use crate::mailbox::Mailbox;
use ratelimit_filter::worker::dispatch::Dispatcher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// A configuration's state on one worker.
pub struct RootState {
    pub config: Arc<FilterConfig>,
    pub dispatcher: Mutex<Dispatcher>,
    /// The dispatcher's tick period (what it asks for), and when it is next due.
    pub period_ms: AtomicU64,
    pub next_ms: AtomicU64,
    /// The answers to the exchanges it sent by the courier.
    pub mailbox: Arc<Mailbox>,
    next_token: AtomicU32,
}

pub type Root = Arc<RootState>;

impl RootState {
    /// A token for a callout of this root, never the same as another's out.
    pub fn token(&self) -> u32 {
        self.next_token
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1)
    }
}

/// Every root, by its configuration's id.
static ROOTS: Mutex<Vec<(u64, Weak<RootState>)>> = Mutex::new(Vec::new());

impl RootState {
    /// `config`'s root on the calling worker, made known to `of`.
    pub fn new(config: &Arc<FilterConfig>) -> Root {
        let root = Arc::new(RootState {
            config: Arc::clone(config),
            dispatcher: Mutex::new(Dispatcher::default()),
            period_ms: AtomicU64::new(100),
            next_ms: AtomicU64::new(0),
            mailbox: Arc::new(Mailbox::default()),
            next_token: AtomicU32::new(0),
        });
        let mut roots = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
        roots.retain(|(_, root)| root.strong_count() > 0);
        roots.push((config.id, Arc::downgrade(&root)));
        root
    }
}

/// The roots of configuration `config_id`, on every worker.
pub fn of(config_id: u64) -> Vec<Root> {
    let roots = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
    roots
        .iter()
        .filter(|(id, _)| *id == config_id)
        .filter_map(|(_, root)| root.upgrade())
        .collect()
}
