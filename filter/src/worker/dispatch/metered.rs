//! The dispatcher's events of metered responses: the response headers start reading what
//! a metered request's response cost, its body chunks pass through the readers, and its end
//! (or the request's, cut short) turns what was measured into a settlement, queued with the
//! exchanges and sent again while its exchanges fail (`Settlements`).

use super::{Dispatcher, Link};
use crate::decision::counters::Counter;
use crate::decision::metered::Metering;
use crate::decision::response::LocalReply;
use crate::host::Proxy;
use crate::wire::CheckResult;
use crate::worker::exchange::Member;

/// What the glue does with a response once its headers are seen.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResponseStart<F> {
    /// The rate-limit fields to add to the response.
    pub fields: Option<F>,
    /// The body must be handed over chunk by chunk (`response_body`).
    pub read_body: bool,
    /// The response must not reach the client: it is answered with this reply instead.
    pub refused: Option<LocalReply>,
}

impl Dispatcher {
    /// Starts metering request `context_id`'s response (of configuration `generation`),
    /// `header` reading its headers; whether its body must be read.
    pub(super) fn start_metering(
        &mut self,
        context_id: u32,
        generation: u64,
        mut metering: Metering,
        header: impl Fn(&str) -> Option<Vec<u8>>,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> bool {
        let Some(config) = self.config_of(generation) else {
            return false;
        };
        let read_body = metering.response_headers(config, header);
        self.metering.insert(context_id, (generation, metering));
        if !read_body {
            self.end_metering(context_id, host, link);
        }
        read_body
    }

    /// A chunk of request `context_id`'s response body; `end`: the last.
    pub fn response_body(
        &mut self,
        context_id: u32,
        chunk: &[u8],
        end: bool,
        host: &impl Proxy,
        link: &mut impl Link,
    ) {
        if let Some((_, metering)) = self.metering.get_mut(&context_id) {
            metering.body(chunk);
            if end {
                metering.ended();
            }
        }
        if end {
            self.end_metering(context_id, host, link);
        }
    }

    /// Request `context_id`'s response ended, or the request did (its response cut short,
    /// unless its end came first): what it measured is settled (`Metering::settle`).
    pub(super) fn end_metering(
        &mut self,
        context_id: u32,
        host: &impl Proxy,
        link: &mut impl Link,
    ) {
        let Some((generation, metering)) = self.metering.remove(&context_id) else {
            return;
        };
        let (number, id) = self.settlements.fresh_id();
        let Some(config) = self.config_of(generation) else {
            return;
        };
        let settlement = metering.settle(config, &id, host, host.now_ms());
        self.counters
            .add(Counter::MeteredTokens, settlement.measured);
        self.counters
            .add(Counter::Unmeasured, settlement.unmeasured);
        self.counters
            .add(Counter::Settled, settlement.settled_locally);
        self.counters
            .add(Counter::Debt, settlement.borrowed_locally);
        if let Some(line) = settlement.line {
            let given_up = self
                .settlements
                .add(number, &line, settlement.rules, host.now_ms());
            self.counters.add(Counter::SettleFailures, given_up);
            self.exchanges
                .enqueue_settlement(number, settlement.rules, line);
            self.wake_root(link);
        }
    }

    /// The settlements among an exchange's `members`, from its reply (or why there is
    /// none): applied ones are done, failed ones go again later.
    pub(super) fn settlements_answered(
        &mut self,
        members: &[Member],
        reply: &Result<Vec<CheckResult>, String>,
        host: &impl Proxy,
    ) {
        for (i, member) in members.iter().enumerate() {
            let Some(number) = member.settlement else {
                continue;
            };
            // Each settlement ends once, in `settled` or in `settle_failures`: one given up
            // while out was counted then (`end_metering`), whatever its answer says.
            match reply.as_ref().map(|results| results.get(i)) {
                Ok(Some(CheckResult::Settled { rules, .. })) => {
                    // Applied, so its debt is real even if it was given up on.
                    let borrowed = rules.iter().map(|r| r.borrowed).sum();
                    self.counters.add(Counter::Debt, borrowed);
                    if self.settlements.done(number) {
                        self.counters.add(Counter::Settled, 1);
                    }
                }
                // A slot's release: a lease return, answered as a check.
                Ok(Some(CheckResult::Checked { .. })) => {
                    if self.settlements.done(number) {
                        self.counters.add(Counter::SlotsReleased, 1);
                    }
                }
                Ok(Some(CheckResult::Refused(reason))) => {
                    log::warn!("the bridge refused a settlement ({reason})");
                    if self.settlements.done(number) {
                        self.counters.add(Counter::SettleFailures, 1);
                    }
                }
                _ => self.settlements.failed(number, host.now_ms()),
            }
        }
    }

    /// Queues the settlements due to go again (on the tick), and counts those given up.
    pub(super) fn retry_settlements(&mut self, now_ms: u64) {
        let (due, given_up) = self.settlements.due(now_ms);
        self.counters.add(Counter::SettleFailures, given_up);
        for (number, line, rules) in due {
            self.exchanges.enqueue_settlement(number, rules, line);
        }
    }
}
