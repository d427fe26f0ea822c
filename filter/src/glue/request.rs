//! One request's context: plans its check, hands it to the hub, pauses, and picks up its
//! response headers once the check is settled.

use super::abi;
use super::host::{callout_reply, carry_out, ProxyHost};
use super::hub::{carry_out_all, with_worker, Hub, Parked, Shared, Verdicts};
use crate::check::{decode_callout, Admission, Start, Verdict};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use ratelimit_config::backend::Transport;
use std::rc::Rc;

/// Where a request's check stands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    /// Held by the hub: waiting, out, or answered.
    Parked,
    /// Parked, and out in this request's own HTTP callout (exchange id).
    Carrying(u32),
    Done,
}

pub(super) struct Request {
    pub(super) shared: Rc<Shared>,
    pub(super) hub: Rc<Hub>,
    pub(super) context_id: u32,
    pub(super) check: Admission,
    pub(super) phase: Phase,
}

impl Request {
    /// Carries out a verdict reached before pausing.
    fn act_now(&mut self, verdict: Verdict) -> Action {
        self.phase = Phase::Done;
        if let Some(metrics) = self.hub.metrics() {
            metrics.count(self.check.outcome);
        }
        match verdict {
            Verdict::Resume => Action::Continue,
            Verdict::Reply(_) => {
                carry_out(&verdict);
                Action::Pause
            }
        }
    }

    /// Hands the check to the hub. On the stream it leaves at once if there is room, with
    /// any other waiting check (the reply goes to the root whatever becomes of this
    /// request). Over HTTP the root sends batches: a callout's reply goes to the context
    /// that sent it, and a batch must not depend on one request living on; only without
    /// group commit (`max_inflight` 0) is a check its own callout, sent by its request.
    /// Redis calls are the root's alone too: a host may cancel the calls of a request
    /// that ends.
    fn park(&mut self, line: String) -> Action {
        let parked = Parked {
            shared: Rc::clone(&self.shared),
            check: std::mem::take(&mut self.check),
            settled: false,
        };
        let rules = parked.check.rule_count();
        if let Ok(mut p) = self.hub.parked.try_borrow_mut() {
            p.insert(self.context_id, parked);
        }
        if let Ok(mut x) = self.hub.exchanges.try_borrow_mut() {
            x.enqueue(self.context_id, rules, line);
        }
        self.phase = Phase::Parked;
        match self.shared.config.backend.transport {
            Transport::Grpc => {
                let verdicts = self.hub.pump(&self.shared).1;
                self.carry_out_settled(verdicts)
            }
            Transport::Http if self.shared.config.backend.max_inflight == 0 => self.own_callout(),
            Transport::Http | Transport::Redis => {
                self.hub.wake_root_if_room();
                Action::Pause
            }
        }
    }

    /// Sends this request's check as its own callout (no group commit).
    fn own_callout(&mut self) -> Action {
        let Some((id, body)) = self.hub.take() else {
            return Action::Pause;
        };
        match self.hub.send(&self.shared, id, &body) {
            Ok(_) => {
                self.phase = Phase::Carrying(id);
                Action::Pause
            }
            Err(reason) => {
                let verdicts = self.hub.fail(&self.shared, id, reason);
                self.carry_out_settled(verdicts)
            }
        }
    }

    /// Carries out verdicts reached while this request is running: its own becomes the
    /// returned action, the others go to their contexts.
    fn carry_out_settled(&mut self, verdicts: Verdicts) -> Action {
        let (own, others): (Vec<_>, Vec<_>) = verdicts
            .into_iter()
            .partition(|(id, _)| *id == self.context_id);
        carry_out_all(&others);
        if !others.is_empty() {
            let _ = abi::set_effective_context(self.context_id);
        }
        let Some((_, verdict)) = own.into_iter().next() else {
            return Action::Pause;
        };
        self.take_settled();
        self.phase = Phase::Done;
        match verdict {
            Verdict::Resume => Action::Continue,
            Verdict::Reply(_) => {
                carry_out(&verdict);
                Action::Pause
            }
        }
    }

    /// Takes the settled check back from the hub (for its response headers).
    fn take_settled(&mut self) {
        if let Ok(mut parked) = self.hub.parked.try_borrow_mut() {
            if let Some(p) = parked.remove(&self.context_id).filter(|p| p.settled) {
                self.check = p.check;
                self.phase = Phase::Done;
            }
        }
    }
}

impl Context for Request {
    /// The reply to this request's own HTTP callout.
    fn on_http_call_response(&mut self, _: u32, num_headers: usize, body_size: usize, _: usize) {
        let Phase::Carrying(id) = self.phase else {
            return;
        };
        self.phase = Phase::Parked;
        let (status, body) = callout_reply(num_headers, body_size);
        let members = self.hub.complete(id).unwrap_or_default();
        let counts: Vec<usize> = members.iter().map(|m| m.rules).collect();
        let verdicts = self.hub.settle(
            &self.shared,
            &members,
            decode_callout(status, &body, &counts),
        );
        carry_out_all(&verdicts);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let start = with_worker(&shared, |worker| {
            self.check
                .start(&shared.config, worker, &ProxyHost::default())
        });
        match start {
            Start::Skip => Action::Continue,
            Start::Decided(verdict) => {
                // Admitted from a lease, which may want a top-up (or a refused request
                // put back what it took from one whose owner has gone).
                self.hub.queue_lease_lines(&shared);
                self.act_now(verdict)
            }
            Start::Ask(line) => self.park(line),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if matches!(self.phase, Phase::Parked | Phase::Carrying(_)) {
            self.take_settled();
        }
        if let Some(fields) = &self.check.response_headers {
            fields.each(|name, value| {
                if let Err(e) = abi::add_response_header(name, value) {
                    log::warn!("adding {name} failed: {e:?}");
                }
            });
        }
        Action::Continue
    }
}

impl Drop for Request {
    /// The stream is gone: its waiting check leaves the queue (an exchange already out
    /// keeps its line; the answer for it finds no one and is skipped), and its own callout,
    /// whose reply will find no one, is done with.
    fn drop(&mut self) {
        if matches!(self.phase, Phase::Idle | Phase::Done) {
            return; // nothing held for it
        }
        if let Ok(mut parked) = self.hub.parked.try_borrow_mut() {
            parked.remove(&self.context_id);
        }
        if let Ok(mut x) = self.hub.exchanges.try_borrow_mut() {
            x.forget(self.context_id);
            if let Phase::Carrying(id) = self.phase {
                x.complete(id);
            }
        }
    }
}
