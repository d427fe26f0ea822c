//! A configuration's end, wherever Envoy ends it. Envoy 1.40 destroys a filter
//! configuration on the thread that lets go of it last: a worker, when a request that
//! began under it outlives a reload. Its destructor then resets the configuration's
//! streams to the bridge on that worker, while the main thread, which owns their
//! connection, may be using it (seen: the next configuration's stream was never
//! answered). So a configuration destroyed off the main thread with streams open has them
//! reset on the main thread first, reached through another live configuration's scheduler
//! (its own no longer runs), and waits for that a bounded time; Envoy then finds none left
//! to reset. Callouts (`transport: "http"`) have no cancel Envoy lets the main thread call:
//! those still out are left to Envoy, with a warning.

use crate::config::FilterConfig;
use crate::courier::TEARDOWN;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::thread::ThreadId;
use std::time::Duration;

/// How long a worker waits for the main thread to reset a destroyed configuration's
/// streams: the main thread may be the one waiting for the worker (Envoy's shutdown).
const WAIT: Duration = Duration::from_secs(1);

/// Envoy's main thread: the one that makes configurations.
static MAIN: OnceLock<ThreadId> = OnceLock::new();

/// Every configuration made, while it lives.
static LIVE: Mutex<Vec<Weak<FilterConfig>>> = Mutex::new(Vec::new());

/// A configuration destroyed on a worker, whose streams the main thread is to reset, and
/// the flag it raises when it has.
struct Ending {
    config: Arc<FilterConfig>,
    done: Arc<(Mutex<bool>, Condvar)>,
}

static ENDING: Mutex<Vec<Ending>> = Mutex::new(Vec::new());

/// On the main thread: `config` was made.
pub fn made(config: &Arc<FilterConfig>) {
    MAIN.get_or_init(|| std::thread::current().id());
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|config| config.strong_count() > 0);
    live.push(Arc::downgrade(config));
}

/// Envoy destroys `config`, on whatever thread: nothing of it reaches Envoy after this,
/// and its streams are gone from the main thread.
pub fn destroyed(config: Arc<FilterConfig>) {
    config.retire();
    if MAIN.get() == Some(&std::thread::current().id()) {
        return;
    }
    if config.courier.callouts_out() > 0 {
        log::warn!(
            "configuration {} destroyed on a worker with {} callout(s) out: Envoy cancels them there",
            config.id,
            config.courier.callouts_out()
        );
    }
    if config.courier.streams_open() == 0 {
        return;
    }
    let other = LIVE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .find(|other| other.id != config.id && other.is_alive());
    let Some(other) = other else {
        log::warn!(
            "configuration {} destroyed on a worker with streams open and no other to reach \
             the main thread: Envoy resets them there",
            config.id
        );
        return;
    };
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    ENDING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Ending {
            config: Arc::clone(&config),
            done: Arc::clone(&done),
        });
    other.courier.wake(TEARDOWN);
    let (flag, raised) = &*done;
    let flag = flag.lock().unwrap_or_else(PoisonError::into_inner);
    let (flag, waited) = raised
        .wait_timeout_while(flag, WAIT, |done| !*done)
        .unwrap_or_else(PoisonError::into_inner);
    if !*flag && waited.timed_out() {
        log::warn!(
            "configuration {}: the main thread did not reset its streams within {WAIT:?}; \
             Envoy resets them on this worker",
            config.id
        );
    }
}

/// On the main thread, at any configuration's event: resets the streams of those
/// destroyed on a worker, which wait for it.
pub fn end_pending() {
    let ending = std::mem::take(&mut *ENDING.lock().unwrap_or_else(PoisonError::into_inner));
    for Ending { config, done } in ending {
        config.end_streams();
        let (flag, raised) = &*done;
        *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        raised.notify_all();
    }
}
