//! Carrying out what the worker's dispatcher decides: running one of its events, then each
//! verdict on its own request (resume it, or answer it), and a check's headers on its
//! response. The glue's contexts hand every event here.

use super::abi;
use super::link::HostLink;
use super::proxy::ProxyHost;
use crate::decision::admission::Verdict;
use crate::decision::response::RateLimitFields;
use crate::worker::dispatch::{Dispatcher, Verdicts};
use std::cell::RefCell;

/// Runs one event of the worker's dispatcher over the host (`queue`: the worker's wake-up
/// queue), then carries out the verdicts it reached, each on its own request: only once
/// the dispatcher is free, as resuming or answering a request may call back into the
/// filter. `back_to`: the request whose callback this is, made the effective context again
/// after others'. An event that finds the dispatcher busy (which a single-threaded VM never
/// should) is logged, never a panic.
pub fn run<T>(
    dispatcher: &RefCell<Dispatcher>,
    queue: Option<u32>,
    back_to: Option<u32>,
    event: impl FnOnce(&mut Dispatcher, &ProxyHost, &mut HostLink) -> (T, Verdicts),
) -> Option<T> {
    let Ok(mut busy) = dispatcher.try_borrow_mut() else {
        log::error!("an event came while the dispatcher was busy; it was dropped");
        return None;
    };
    let (out, verdicts) = event(&mut busy, &ProxyHost::default(), &mut HostLink { queue });
    drop(busy);
    for (context_id, verdict) in &verdicts {
        if abi::set_effective_context(*context_id).is_ok() {
            carry_out(verdict);
        }
    }
    if let Some(context_id) = back_to.filter(|_| !verdicts.is_empty()) {
        let _ = abi::set_effective_context(context_id);
    }
    Some(out)
}

/// Adds a check's rate-limit fields to the response on its way back.
pub fn add_response_headers(fields: &RateLimitFields) {
    fields.each(|name, value| {
        if let Err(e) = abi::add_response_header(name, value) {
            log::warn!("adding {name} failed: {e:?}");
        }
    });
}

/// Carries out a verdict on the current (effective) request, which is paused.
pub fn carry_out(verdict: &Verdict) {
    match verdict {
        Verdict::Resume => {
            if let Err(e) = abi::resume_request() {
                log::warn!("resume failed: {e:?}");
            }
        }
        Verdict::Reply(reply) => {
            let body = reply.body.as_bytes();
            if let Err(e) = abi::send_local_reply(reply.status, &reply.headers, body) {
                log::warn!("local reply failed: {e:?}");
            }
        }
    }
}
