//! A configuration's state on one worker (a lane): its dispatcher, behind a mutex because
//! Envoy's main thread ticks it too (`worker::tick_all`), its tick, its mailbox and its
//! callout tokens; and every lane of a configuration, across workers, for that tick.

use crate::config::FilterConfig;
use crate::courier::Mailbox;
use ratelimit_filter::worker::dispatch::Dispatcher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// A configuration's state on one worker.
pub struct LaneState {
    pub config: Arc<FilterConfig>,
    pub dispatcher: Mutex<Dispatcher>,
    /// The dispatcher's tick period (what it asks for), and when it is next due.
    pub period_ms: AtomicU64,
    pub next_ms: AtomicU64,
    /// The answers to the exchanges it sent by the courier.
    pub mailbox: Arc<Mailbox>,
    next_token: AtomicU32,
}

pub type Lane = Arc<LaneState>;

impl LaneState {
    /// A token for a callout of this lane, never the same as another's out.
    pub fn token(&self) -> u32 {
        self.next_token
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1)
    }
}

/// Every lane, by its configuration's id.
static LANES: Mutex<Vec<(u64, Weak<LaneState>)>> = Mutex::new(Vec::new());

impl LaneState {
    /// `config`'s lane on the calling worker, made known to `of`.
    pub fn new(config: &Arc<FilterConfig>) -> Lane {
        let lane = Arc::new(LaneState {
            config: Arc::clone(config),
            dispatcher: Mutex::new(Dispatcher::default()),
            period_ms: AtomicU64::new(100),
            next_ms: AtomicU64::new(0),
            mailbox: Arc::new(Mailbox::default()),
            next_token: AtomicU32::new(0),
        });
        let mut lanes = LANES.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.retain(|(_, lane)| lane.strong_count() > 0);
        lanes.push((config.id, Arc::downgrade(&lane)));
        lane
    }
}

/// The lanes of configuration `config_id`, on every worker.
pub fn of(config_id: u64) -> Vec<Lane> {
    let lanes = LANES.lock().unwrap_or_else(PoisonError::into_inner);
    lanes
        .iter()
        .filter(|(id, _)| *id == config_id)
        .filter_map(|(_, lane)| lane.upgrade())
        .collect()
}
