//! The virtual clock: a test moves time, and what falls due on the way (ticks, callout
//! timeouts) runs in time order, each its own event, as a real proxy's event loop would.
//! It sits above `stream` because a timed-out callout is answered the way `stream`
//! answers every callout.

use crate::callout::CalloutState;
use crate::error::HarnessError;
use crate::vm::Host;
use std::time::Duration;

impl Host {
    /// Moves both clocks forward by `by`, firing due ticks and timing out due callouts in
    /// time order, as the event loop of a real proxy would: each its own event, followed by
    /// the notifications it posted.
    pub fn advance(&mut self, by: Duration) -> Result<(), HarnessError> {
        self.event(|host| host.advance_now(by))
    }

    fn advance_now(&mut self, by: Duration) -> Result<(), HarnessError> {
        let by_ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let target = self.state().now_ns.saturating_add(by_ns);
        loop {
            let state = self.state();
            let offset = state.now_ns.wrapping_sub(state.monotonic_ns);
            let tick = state.next_tick_ns.filter(|&t| t <= target);
            let callout = state
                .callouts
                .iter()
                .filter(|c| c.state == CalloutState::Pending)
                .map(|c| (c.deadline_ns().wrapping_add(offset), c.token))
                .filter(|&(at, _)| at <= target)
                .min();
            match (tick, callout) {
                (Some(t), c) if c.is_none_or(|(at, _)| t <= at) => {
                    self.set_now(t);
                    let period = u64::from(self.state().tick_period_ms) * 1_000_000;
                    self.state_mut().next_tick_ns = Some(t.saturating_add(period.max(1)));
                    self.tick()?;
                    self.deliver_posted()?;
                }
                (_, Some((at, token))) => {
                    self.set_now(at);
                    self.time_out_callout(token)?;
                    self.deliver_posted()?;
                }
                _ => break,
            }
        }
        self.set_now(target);
        Ok(())
    }

    fn set_now(&mut self, now_ns: u64) {
        let state = self.state_mut();
        let delta = now_ns.saturating_sub(state.now_ns);
        state.now_ns = state.now_ns.saturating_add(delta);
        state.monotonic_ns = state.monotonic_ns.saturating_add(delta);
    }
}
