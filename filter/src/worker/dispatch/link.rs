//! What the dispatcher asks of the host besides the request it reads (`host::Proxy`): one
//! interface for every way an exchange travels (a message on the worker's gRPC stream, an
//! HTTP callout, Higress's redis call), the worker's timer, and its metrics. The glue
//! implements it over the ABI; the dispatcher's tests over a recording fake. Also the
//! dispatcher's flush of its counts through it.

use super::Dispatcher;
use crate::decision::counters::PER_RULE;
use crate::wire::redis_call::Invoke;
use ratelimit_config::backend::Backend;
use std::time::Duration;

pub trait Link {
    /// Sends exchange `id` (`body`, its lines) on the open stream `token`; its reply comes
    /// to `Dispatcher::stream_message`.
    fn stream_send(&mut self, token: u32, id: u32, body: &str) -> Result<(), String>;
    /// Sends `body` as an HTTP callout to the bridge; the token its reply will name (to
    /// the context running now).
    fn callout(&mut self, backend: &Backend, body: &str) -> Result<u32, String>;
    /// Sends request `context_id`'s own check as an HTTP callout, whose reply comes to
    /// `Dispatcher::own_callout_reply`: a callout the request owns, where a host tells
    /// those apart from the worker's (a native module's die with their request).
    fn own_callout(
        &mut self,
        context_id: u32,
        backend: &Backend,
        body: &str,
    ) -> Result<u32, String> {
        let _ = context_id;
        self.callout(backend, body)
    }
    /// Sends `body` as one script call on Redis (the redis-call build); the token its
    /// reply will name. A build without the redis call answers an error.
    fn redis_call(&mut self, backend: &Backend, body: &str, invoke: Invoke) -> Result<u32, String>;
    /// Opens the worker's stream to the bridge: its token.
    fn open_stream(&mut self, backend: &Backend) -> Result<u32, String>;
    /// Closes a stream (one the host already closed is fine).
    fn close_stream(&mut self, token: u32);
    /// Asks the host to call `Dispatcher::wake` right after the current callback; `false`
    /// where it cannot, and the dispatcher wakes with a short tick instead.
    fn post_wake(&mut self) -> bool;
    fn set_tick(&mut self, period: Duration);
    /// A counter's metric id (the host hands back the existing one for a name it knows).
    fn define_counter(&mut self, name: &str) -> Option<u32>;
    fn add_to_counter(&mut self, id: u32, n: u64);
}

impl Dispatcher {
    /// Hands the counts to the host: the worker's, and each configuration's per rule; a
    /// configuration no request holds any more is dropped once its counts are out. Each
    /// tick does; a host whose counters cost nothing to add to (a native module's) may
    /// after every event.
    pub fn flush(&mut self, link: &mut impl Link) {
        for (counter, n) in self.counters.drain() {
            let id = self.counter_ids.iter().find(|(c, _)| *c == counter);
            if let Some(id) = id.and_then(|(_, id)| *id) {
                link.add_to_counter(id, n);
            }
        }
        for generation in &mut self.generations {
            for (rule, counter, n) in generation.worker.rule_counts.drain() {
                let slot = PER_RULE.iter().position(|&c| c == counter);
                if let Some(id) = slot.and_then(|s| *generation.rule_ids.get(rule)?.get(s)?) {
                    link.add_to_counter(id, n);
                }
            }
        }
        let (requests, metering) = (&self.requests, &self.metering);
        let last = self.generations.last().map(|g| g.number);
        self.generations.retain(|g| {
            Some(g.number) == last
                || requests.values().any(|held| held.generation == g.number)
                || metering
                    .values()
                    .any(|(generation, _)| *generation == g.number)
        });
    }
}
