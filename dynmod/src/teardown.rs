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

/// Where a destroyed configuration's wait stands. The main thread resets its streams only
/// while the worker still waits (`Waiting`), under the lock the worker needs to give up:
/// once it gives up (`Abandoned`), Envoy goes on to free the configuration, which the main
/// thread must then never touch.
#[derive(PartialEq)]
enum Wait {
    Waiting,
    Done,
    Abandoned,
}

/// A configuration destroyed on a worker, whose streams the main thread is to reset, and
/// where its wait stands.
struct Ending {
    config: Arc<FilterConfig>,
    wait: Arc<(Mutex<Wait>, Condvar)>,
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
    let callouts = config.courier.callouts_out();
    if callouts > 0 {
        log::warn!(
            "configuration {} destroyed on a worker with {callouts} callout(s) out: Envoy \
             cancels them there",
            config.id
        );
    }
    if config.courier.streams_open() == 0 {
        return;
    }
    // Retired above, this configuration is not among the live ones.
    let other = LIVE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .find(|other| other.is_alive());
    let Some(other) = other else {
        log::warn!(
            "configuration {} destroyed on a worker with streams open and no other to reach \
             the main thread: Envoy resets them there",
            config.id
        );
        return;
    };
    let wait = Arc::new((Mutex::new(Wait::Waiting), Condvar::new()));
    ENDING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Ending {
            config: Arc::clone(&config),
            wait: Arc::clone(&wait),
        });
    other.courier.wake(TEARDOWN);
    let (state, changed) = &*wait;
    let state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut state, _) = changed
        .wait_timeout_while(state, WAIT, |state| *state == Wait::Waiting)
        .unwrap_or_else(PoisonError::into_inner);
    if *state == Wait::Waiting {
        *state = Wait::Abandoned;
        log::warn!(
            "configuration {}: the main thread did not reset its streams within {WAIT:?}; \
             Envoy resets them on this worker",
            config.id
        );
    }
}

/// On the main thread, at any configuration's event: resets the streams of those
/// destroyed on a worker that still wait for it.
pub fn end_pending() {
    let ending = std::mem::take(&mut *ENDING.lock().unwrap_or_else(PoisonError::into_inner));
    for Ending { config, wait } in ending {
        let (state, changed) = &*wait;
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if *state == Wait::Waiting {
            config.end_streams();
            *state = Wait::Done;
            changed.notify_all();
        }
    }
}
