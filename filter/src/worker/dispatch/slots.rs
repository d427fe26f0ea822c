//! The dispatcher's events of in-flight slots: a check that took them holds them, the tick
//! renews them, the request's end releases them (a release goes again while its exchange
//! fails, as a settlement does), and a request gone while its check was out releases them
//! once its answer comes.

use super::{Dispatcher, Link};
use crate::decision::counters::Counter;
use crate::decision::slots::SlotLines;
use crate::host::Proxy;
use crate::worker::exchange::NO_REQUEST;

impl Dispatcher {
    /// Queues the release of a request's slots, sent again while it fails (`Settlements`).
    pub(super) fn release_slots(
        &mut self,
        lines: SlotLines,
        host: &impl Proxy,
        link: &mut impl Link,
    ) {
        let (number, _) = self.settlements.fresh_id();
        let given_up = self
            .settlements
            .add(number, &lines.release, lines.rules, host.now_ms());
        self.counters.add(Counter::SettleFailures, given_up);
        self.exchanges
            .enqueue_settlement(number, lines.rules, lines.release);
        self.wake_root(link);
    }

    /// Queues the renewals due (on the tick); a renewal lost is made up by the next one, a
    /// third of the slots' life later.
    pub(super) fn renew_slots(&mut self, now_ms: u64, link: &mut impl Link) {
        let due = self.slots.due(now_ms);
        if due.is_empty() {
            return;
        }
        self.counters.add(Counter::SlotRenewals, due.len() as u64);
        for (line, rules) in due {
            self.exchanges.enqueue(NO_REQUEST, rules, line);
        }
        self.wake_root(link);
    }
}
