//! What one Envoy worker keeps: a dispatcher for each filter configuration in use (made the
//! first time one of its requests comes to this worker), and its live requests, by the
//! context id the dispatcher knows them by. Thread-local: Envoy runs a request's hooks on
//! its worker only. Also running one event on a dispatcher and carrying out its verdicts,
//! each on its own request.

use crate::abi::{self, FilterEnvoyPtr};
use crate::config::FilterConfig;
use crate::courier::Mailbox;
use crate::host::{ModuleHost, ModuleLink, Tick};
use ratelimit_filter::decision::admission::Verdict;
use ratelimit_filter::host::Proxy;
use ratelimit_filter::worker::dispatch::{Dispatcher, Verdicts};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A configuration's dispatcher on this worker, and its tick.
#[derive(Clone)]
pub struct Lane {
    pub config: Arc<FilterConfig>,
    pub dispatcher: Rc<RefCell<Dispatcher>>,
    pub tick: Rc<Tick>,
    /// The answers to the exchanges it sent by the courier.
    pub mailbox: Arc<Mailbox>,
}

/// A live request: its filter, and whether it waits for a verdict.
struct Live {
    filter: FilterEnvoyPtr,
    waiting: Rc<Cell<bool>>,
}

#[derive(Default)]
struct Worker {
    lanes: Vec<Lane>,
    requests: HashMap<u32, Live>,
    next_context: u32,
    /// The dispatcher's token for each callout out, by the request that sent it and
    /// Envoy's id for it (Envoy numbers a request's callouts on their own).
    callouts: HashMap<(u32, u64), u32>,
    next_token: u32,
}

thread_local! {
    static WORKER: RefCell<Worker> = RefCell::new(Worker::default());
}

/// `config`'s lane on this worker, made (and configured over `filter`) the first time.
pub fn lane(config: &Arc<FilterConfig>, filter: FilterEnvoyPtr) -> Lane {
    let found = WORKER.with_borrow_mut(|w| {
        w.lanes.retain(|lane| lane.config.is_alive());
        w.lanes
            .iter()
            .find(|lane| lane.config.id == config.id)
            .cloned()
    });
    if let Some(lane) = found {
        return lane;
    }
    let lane = Lane {
        config: Arc::clone(config),
        dispatcher: Rc::new(RefCell::new(Dispatcher::default())),
        tick: Rc::new(Tick::default()),
        mailbox: Arc::new(Mailbox::default()),
    };
    run(&lane, filter, 0, |d, host, link| {
        ((), d.configure(config.config.clone(), host, link))
    });
    WORKER.with_borrow_mut(|w| w.lanes.push(lane.clone()));
    lane
}

/// A new request on `filter`: its context id, and the flag that says it waits.
pub fn arrive(filter: FilterEnvoyPtr) -> (u32, Rc<Cell<bool>>) {
    WORKER.with_borrow_mut(|w| {
        w.next_context = w.next_context.wrapping_add(1).max(1);
        let waiting = Rc::new(Cell::new(false));
        let live = Live {
            filter,
            waiting: Rc::clone(&waiting),
        };
        w.requests.insert(w.next_context, live);
        (w.next_context, waiting)
    })
}

/// Request `context_id` is gone: the tokens of the callouts it had out, which Envoy
/// cancelled with it.
pub fn leave(context_id: u32) -> Vec<u32> {
    WORKER.with_borrow_mut(|w| {
        w.requests.remove(&context_id);
        let mut lost = Vec::new();
        w.callouts.retain(|(context, _), token| {
            let ours = *context == context_id;
            if ours {
                lost.push(*token);
            }
            !ours
        });
        lost
    })
}

/// A token for a callout, never the same as another's out on this worker.
pub fn token() -> u32 {
    WORKER.with_borrow_mut(|w| {
        w.next_token = w.next_token.wrapping_add(1).max(1);
        w.next_token
    })
}

/// The token of a callout request `context_id` sent, which Envoy calls `envoy_id`.
pub fn sent(context_id: u32, envoy_id: u64) -> u32 {
    let token = token();
    WORKER.with_borrow_mut(|w| w.callouts.insert((context_id, envoy_id), token));
    token
}

/// Whether request `context_id` has callouts out.
pub fn carries(context_id: u32) -> bool {
    WORKER.with_borrow(|w| w.callouts.keys().any(|(context, _)| *context == context_id))
}

/// The token of the callout answered now.
pub fn answered(context_id: u32, envoy_id: u64) -> Option<u32> {
    WORKER.with_borrow_mut(|w| w.callouts.remove(&(context_id, envoy_id)))
}

/// Runs one event on `lane`'s dispatcher over `filter` (null: no request), the tick first
/// if it is due, then carries out the verdicts reached. An event that finds the dispatcher
/// busy (a hook re-entered from a verdict carried out) is logged and dropped.
pub fn run<T>(
    lane: &Lane,
    filter: FilterEnvoyPtr,
    context: u32,
    event: impl FnOnce(&mut Dispatcher, &ModuleHost, &mut ModuleLink) -> (T, Verdicts),
) -> Option<T> {
    let Ok(mut dispatcher) = lane.dispatcher.try_borrow_mut() else {
        log::error!("an event came while the dispatcher was busy; it was dropped");
        return None;
    };
    let host = ModuleHost::new(filter);
    let mut link = ModuleLink {
        filter,
        context,
        config: &lane.config,
        tick: &lane.tick,
        mailbox: &lane.mailbox,
        wake: false,
    };
    let now = host.now_ms();
    let mut verdicts = Vec::new();
    for (token, status, body) in lane.mailbox.take() {
        verdicts.extend(dispatcher.callout_reply(token, status, &body, &host, &mut link));
    }
    if dispatcher.is_configured() && now >= lane.tick.next_ms.get() {
        verdicts.extend(dispatcher.tick(&host, &mut link));
        lane.tick
            .next_ms
            .set(now.saturating_add(lane.tick.period_ms.get()));
    }
    let (out, more) = event(&mut dispatcher, &host, &mut link);
    verdicts.extend(more);
    // A wake-up asked for during the event comes right after it, as `Link::post_wake`
    // promises; one that asks again waits for the next event's.
    if std::mem::take(&mut link.wake) {
        verdicts.extend(dispatcher.wake(&host, &mut link));
    }
    // Adding to Envoy's counters is a native atomic add here, not a call out of a VM, so
    // the counts go out at once rather than wait for a tick that no timer drives.
    dispatcher.flush(&mut link);
    drop(dispatcher);
    for (context_id, verdict) in &verdicts {
        let live = WORKER.with_borrow(|w| {
            let live = w.requests.get(context_id)?;
            Some((live.filter, Rc::clone(&live.waiting)))
        });
        if let Some((filter, waiting)) = live {
            waiting.set(false);
            carry_out(filter, verdict);
        }
    }
    Some(out)
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
