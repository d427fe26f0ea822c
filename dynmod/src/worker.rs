//! What a worker keeps: its roots (`root`) and its live requests, by the context id the
//! dispatcher knows them by. A root's dispatcher is behind a mutex because Envoy's main
//! thread ticks every root (`tick_all`): Envoy gives an HTTP filter module no timer on a
//! worker, and an idle worker's leases must still end and its settlements still be
//! retried. Its hooks' turns are the worker's; the main thread's tick only meets them at
//! the lock.
//!
//! Also running one event on a root's dispatcher and carrying out its verdicts, each on
//! its own request.

use crate::abi::{self, FilterEnvoyPtr};
use crate::config::FilterConfig;
use crate::host::{ModuleHost, ModuleLink};
use crate::mailbox::Answer;
use crate::root::{self, Root, RootState};
use ratelimit_filter::decision::admission::Verdict;
use ratelimit_filter::host::Proxy;
use ratelimit_filter::worker::dispatch::{Dispatcher, Verdicts};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};

/// A live request: its filter, and whether its scheduler is one of its root's wakers.
struct Live {
    filter: FilterEnvoyPtr,
    waker: bool,
}

#[derive(Default)]
struct Worker {
    roots: Vec<Root>,
    requests: HashMap<u32, Live>,
    next_context: u32,
}

thread_local! {
    static WORKER: RefCell<Worker> = RefCell::new(Worker::default());
    /// This thread holds a root's dispatcher: a hook re-entered from a verdict carried out
    /// must not wait for itself.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// `config`'s root on this worker, made (and configured over `filter`) the first time.
pub fn root(config: &Arc<FilterConfig>, filter: FilterEnvoyPtr) -> Root {
    let found = WORKER.with_borrow_mut(|w| {
        w.roots.retain(|root| root.config.is_alive());
        w.roots
            .iter()
            .find(|root| root.config.id == config.id)
            .cloned()
    });
    if let Some(root) = found {
        return root;
    }
    let root = RootState::new(config);
    run(&root, filter, 0, |d, host, link| {
        ((), d.configure(config.config.clone(), host, link))
    });
    WORKER.with_borrow_mut(|w| w.roots.push(Arc::clone(&root)));
    root
}

/// A new request on `filter`: its context id.
pub fn arrive(filter: FilterEnvoyPtr) -> u32 {
    WORKER.with_borrow_mut(|w| {
        w.next_context = w.next_context.wrapping_add(1).max(1);
        let live = Live {
            filter,
            waker: false,
        };
        w.requests.insert(w.next_context, live);
        w.next_context
    })
}

/// Request `context_id` of `root` is gone (Envoy cancelled its own check's callout with
/// it). Its waker is deleted first, so that its last turn, after this, finds whatever was
/// delivered while it was one.
pub fn leave(root: &RootState, context_id: u32) {
    let live = WORKER.with_borrow_mut(|w| w.requests.remove(&context_id));
    if live.is_some_and(|live| live.waker) {
        root.mailbox.leave(context_id);
    }
}

/// Request `context` (on `filter`) waits for a verdict: its scheduler becomes a waker of
/// `root`, if it is not one yet. For a check that waits on a batch the courier carries,
/// this comes with the dispatcher held, so the main thread never takes a waiting worker's
/// turn for it (`tick_all`).
pub fn keep_waker(root: &RootState, context: u32, filter: FilterEnvoyPtr) {
    let fresh = WORKER.with_borrow_mut(|w| match w.requests.get_mut(&context) {
        Some(live) if !live.waker => {
            live.waker = true;
            true
        }
        _ => false,
    });
    if fresh {
        root.mailbox
            .add_waker(context, abi::filter_scheduler(filter));
    }
}

fn hold(root: &RootState) -> Option<MutexGuard<'_, Dispatcher>> {
    if HOLDING.get() {
        return None;
    }
    HOLDING.set(true);
    Some(
        root.dispatcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    )
}

/// What every turn on a dispatcher starts with: the courier's answers, and the tick if it
/// is due.
fn catch_up(
    root: &RootState,
    d: &mut Dispatcher,
    host: &ModuleHost,
    link: &mut ModuleLink,
) -> Verdicts {
    let mut verdicts = Vec::new();
    for answer in root.mailbox.take() {
        verdicts.extend(match answer {
            Answer::Callout {
                token,
                status,
                body,
            } => d.callout_reply(token, status, &body, host, link),
            Answer::Message { stream, bytes } => d.stream_message(stream, &bytes, host, link),
            Answer::Closed { stream, status } => d.stream_closed(stream, status, host, link),
        });
    }
    let now = host.now_ms();
    if d.is_configured() && now >= root.next_ms.load(Ordering::Relaxed) {
        verdicts.extend(d.tick(host, link));
        let next = now.saturating_add(root.period_ms.load(Ordering::Relaxed));
        root.next_ms.store(next, Ordering::Relaxed);
    }
    verdicts
}

/// Runs one event on `root`'s dispatcher over `filter` (null: no request) for request
/// `context` (0: none), after `catch_up`, then carries out the verdicts reached. An event
/// that finds the dispatcher held by this thread (a hook re-entered from a verdict carried
/// out) is logged and dropped.
pub fn run<T>(
    root: &RootState,
    filter: FilterEnvoyPtr,
    context: u32,
    event: impl FnOnce(&mut Dispatcher, &ModuleHost, &mut ModuleLink) -> (T, Verdicts),
) -> Option<T> {
    let Some(mut dispatcher) = hold(root) else {
        log::error!("an event came while the dispatcher was busy; it was dropped");
        return None;
    };
    let host = ModuleHost::new(filter);
    let mut link = ModuleLink::new(filter, root);
    let mut verdicts = catch_up(root, &mut dispatcher, &host, &mut link);
    let (out, more) = event(&mut dispatcher, &host, &mut link);
    verdicts.extend(more);
    // A wake-up asked for during the event comes right after it, as `Link::post_wake`
    // promises; one that asks again waits for the next turn. The dispatcher asks for one
    // when a check waits to leave in a batch: its request may wait on the courier.
    if std::mem::take(&mut link.wake) {
        verdicts.extend(dispatcher.wake(&host, &mut link));
        if context != 0 && !filter.is_null() {
            keep_waker(root, context, filter);
        }
    }
    // Adding to Envoy's counters is a native atomic add here, not a call out of a VM, so
    // the counts go out at once.
    dispatcher.flush(&mut link);
    drop(dispatcher);
    HOLDING.set(false);
    for (context_id, verdict) in &verdicts {
        let live = WORKER.with_borrow(|w| Some(w.requests.get(context_id)?.filter));
        if let Some(filter) = live {
            carry_out(filter, verdict);
        }
    }
    Some(out)
}

/// On Envoy's main thread: every root of `config` takes its turn (`catch_up`), whatever
/// traffic its worker has: on its worker through a waker when it has one (a request of it
/// waits: only there can a verdict be carried out), here otherwise. What they send leaves
/// by the courier.
pub fn tick_all(config: &FilterConfig) {
    for root in root::of(config.id) {
        let Some(mut dispatcher) = hold(&root) else {
            continue;
        };
        if root.mailbox.has_wakers() {
            drop(dispatcher);
            HOLDING.set(false);
            root.mailbox.wake();
            continue;
        }
        let host = ModuleHost::new(std::ptr::null_mut());
        let mut link = ModuleLink::new(std::ptr::null_mut(), &root);
        let mut verdicts = catch_up(&root, &mut dispatcher, &host, &mut link);
        if std::mem::take(&mut link.wake) {
            verdicts.extend(dispatcher.wake(&host, &mut link));
        }
        dispatcher.flush(&mut link);
        drop(dispatcher);
        HOLDING.set(false);
        // Without a waker no request of this root waits on a batch: a verdict here is for
        // a request that is gone, or one waiting on its own callout, which answers it.
        if !verdicts.is_empty() {
            log::debug!("{} verdict(s) reached on the main thread", verdicts.len());
        }
    }
}

/// A verdict on a paused request.
pub fn carry_out(filter: FilterEnvoyPtr, verdict: &Verdict) {
    match verdict {
        Verdict::Resume => abi::continue_decoding(filter),
        Verdict::Reply(reply) => {
            let headers: Vec<(&str, &[u8])> = reply
                .headers
                .iter()
                .map(|(k, v)| (*k, v.as_bytes()))
                .collect();
            abi::send_response(filter, reply.status, &headers, reply.body.as_bytes());
        }
    }
}
