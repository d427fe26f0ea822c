//! A worker's dispatcher: everything one Envoy worker keeps across its requests and
//! configurations (the checks held for paused requests, the group commit, the stream to
//! the bridge, the calls out, the counters), owned in one place and changed only through
//! its events.
//!
//! Events come in from the glue (a configuration accepted, a request's headers, its
//! response headers, its end; a reply on the stream, to a callout or to a redis call; the
//! stream closed; a tick; a wake-up); what they make the host do goes out through `Link`
//! (send, open, close, timers, metrics) or comes back as verdicts for paused requests. The
//! glue carries the verdicts out once the dispatcher is no longer borrowed: resuming a
//! request or answering it may call back into the filter.
//!
//! Host-independent: the exchange lifecycle, the hand-over of leases on reconfiguration and
//! the stream's reconnect backoff are unit-tested natively (`dispatch_tests.rs`).

mod link;
mod metered;
mod replies;
mod requests;
mod slots;

pub use link::Link;
pub use metered::ResponseStart;
pub use requests::Go;

use crate::decision::admission::{conclude_exchange, Admission, Concluding, Verdict, Worker};
use crate::decision::counters::{self, Counter, Counters, PER_RULE};
use crate::decision::metered::Metering;
use crate::host::Proxy;
use crate::wire::redis_call::Invoke;
use crate::wire::{self, CheckResult};
use crate::worker::exchange::{Exchanges, Member, NO_REQUEST};
use crate::worker::settlements::Settlements;
use crate::worker::slots::Slots;
use hashbrown::HashMap;
use ratelimit_config::backend::Transport;
use ratelimit_config::config::Config;
use std::time::Duration;

/// The tick that wakes the dispatcher to send waiting checks where the host has no queue
/// to post to.
pub const WAKE: Duration = Duration::from_millis(1);
/// Longest wait before reopening a stream that keeps closing.
pub const MAX_REOPEN_BACKOFF_MS: u64 = 5_000;

/// Verdicts to carry out, by request context id.
pub type Verdicts = Vec<(u32, Verdict)>;

/// A configuration and the worker state that goes with it. An older one lives on while
/// requests it started hold their checks.
struct Generation {
    number: u64,
    config: Config,
    worker: Worker,
    /// The metric ids of the per-rule counters (`PER_RULE`) of `config`'s rules.
    rule_ids: Vec<[Option<u32>; PER_RULE.len()]>,
}

/// A request's admission, held while its check waits, is out, or is decided and its
/// response headers not yet added.
struct Held {
    generation: u64,
    admission: Admission,
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting or out in an exchange the dispatcher sent.
    Parked,
    /// Out in this request's own HTTP callout (exchange id): no group commit.
    Carrying(u32),
    /// Decided; the response headers are still to come.
    Decided,
    /// Its check waits for its body, which a rule reserves from.
    Reading,
}

/// A callout or redis call the dispatcher sent: its exchange, and for a redis call what
/// to send again as `EVAL` if Redis has lost the script.
struct Call {
    id: u32,
    redis: Option<(String, Invoke)>,
}

#[derive(Default)]
pub struct Dispatcher {
    /// Oldest first; the last is the current configuration.
    generations: Vec<Generation>,
    exchanges: Exchanges,
    requests: HashMap<u32, Held>,
    /// Metered responses being read, by request, with their configuration's number.
    metering: HashMap<u32, (u64, Metering)>,
    settlements: Settlements,
    /// Requests holding in-flight slots.
    slots: Slots,
    calls: HashMap<u32, Call>,
    /// The open stream to the bridge, and the cluster it goes to.
    stream: Option<(u32, String)>,
    /// Reopening a closed stream waits this long (doubling while it keeps closing).
    reopen_backoff_ms: u64,
    reopen_at_ms: u64,
    /// A wake-up was asked for and has not come yet.
    wake_asked: bool,
    counters: Counters,
    counter_ids: Vec<(Counter, Option<u32>)>,
}

impl Dispatcher {
    /// Whether a configuration has been accepted (requests are only checked then).
    pub fn is_configured(&self) -> bool {
        !self.generations.is_empty()
    }

    /// The tick that times out stream exchanges, reopens the stream and flushes counters.
    pub fn base_tick(config: &Config) -> Duration {
        Duration::from_millis((config.backend.timeout_ms / 4).clamp(1, 100))
    }

    /// A new configuration (validated) takes over; what is in flight or waiting stays.
    /// The previous one's leases end (their tokens go back under the new backend) and
    /// the top-ups it has out are answered to the new worker.
    pub fn configure(
        &mut self,
        config: Config,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        if self.counter_ids.is_empty() {
            self.counter_ids = Counter::ALL
                .iter()
                .map(|&c| (c, link.define_counter(c.name())))
                .collect();
        }
        self.exchanges.set_max_inflight(config.backend.max_inflight);
        // One script call has one mode: checks and lease returns travel apart.
        self.exchanges
            .set_one_mode(config.backend.transport == Transport::Redis);
        link.set_tick(Dispatcher::base_tick(&config));
        let rule_ids = config
            .rules
            .iter()
            .map(|rule| {
                PER_RULE.map(|c| link.define_counter(&counters::per_rule_name(c, &rule.name)))
            })
            .collect();
        let number = self.generations.last().map_or(0, |g| g.number + 1);
        let mut fresh = Generation {
            number,
            worker: Worker::new(&config),
            config,
            rule_ids,
        };
        if let Some(old) = self.generations.last_mut() {
            old.worker.leases.end_all();
            queue_lease_lines(&mut old.worker, &mut self.exchanges);
            fresh.worker.leases.adopt_top_ups(&mut old.worker.leases);
        }
        let backend = fresh.config.backend.clone();
        self.generations.push(fresh);
        self.wake_if_waiting(link);
        let wanted = backend.transport == Transport::Grpc;
        let mut verdicts = Vec::new();
        if let Some((token, cluster)) = self.stream.take() {
            if wanted && cluster == backend.cluster {
                self.stream = Some((token, cluster));
            } else {
                link.close_stream(token);
                verdicts = self.abandon_all("the bridge's cluster changed", host, link);
            }
        }
        if wanted && self.stream.is_none() {
            self.reopen_backoff_ms = 0;
            self.open_stream(host, link);
        }
        verdicts
    }

    /// The safety net: gives up stream and redis exchanges past `timeout_ms`, reopens the
    /// stream, sends what waits, flushes the counters.
    pub fn tick(&mut self, host: &impl Proxy, link: &mut impl Link) -> Verdicts {
        let Some(current) = self.generations.last_mut() else {
            return Vec::new();
        };
        let now = host.now_ms();
        current.worker.leases.expire(now);
        queue_lease_lines(&mut current.worker, &mut self.exchanges);
        self.retry_settlements(now);
        self.renew_slots(now, link);
        let Some(current) = self.generations.last_mut() else {
            return Vec::new();
        };
        let backend = &current.config.backend;
        let (transport, timeout_ms) = (backend.transport, backend.timeout_ms);
        let base = Dispatcher::base_tick(&current.config);
        let mut verdicts = Vec::new();
        if matches!(transport, Transport::Grpc | Transport::Redis) {
            for members in self.exchanges.expire(now, timeout_ms) {
                let reason = Err("no answer within timeout_ms".to_string());
                verdicts.extend(self.conclude(&members, reason, host, link));
            }
            // A reply that never comes must not keep its batch forever.
            let exchanges = &self.exchanges;
            self.calls.retain(|_, call| exchanges.in_flight(call.id));
        }
        if transport == Transport::Grpc && self.stream.is_none() && now >= self.reopen_at_ms {
            self.open_stream(host, link);
        }
        verdicts.extend(self.pump(host, link));
        if std::mem::take(&mut self.wake_asked) {
            link.set_tick(base);
        }
        self.flush(link);
        verdicts
    }

    /// The wake-up asked for (`Link::post_wake`) has come: sends what waits.
    pub fn wake(&mut self, host: &impl Proxy, link: &mut impl Link) -> Verdicts {
        self.wake_asked = false;
        self.pump(host, link)
    }

    fn stream_token(&self) -> Option<u32> {
        self.stream.as_ref().map(|(token, _)| *token)
    }

    fn open_stream(&mut self, host: &impl Proxy, link: &mut impl Link) {
        let Some(backend) = self.generations.last().map(|g| &g.config.backend) else {
            return;
        };
        match link.open_stream(backend) {
            Ok(token) => self.stream = Some((token, backend.cluster.clone())),
            Err(e) => {
                log::warn!("{e}");
                self.schedule_reopen(host);
            }
        }
    }

    fn schedule_reopen(&mut self, host: &impl Proxy) {
        self.reopen_backoff_ms = (self.reopen_backoff_ms * 2).clamp(100, MAX_REOPEN_BACKOFF_MS);
        self.reopen_at_ms = host.now_ms() + self.reopen_backoff_ms;
    }

    /// Concludes exchange `id` from its reply, then sends what waits at once: group commit.
    fn answered(
        &mut self,
        id: u32,
        host: &impl Proxy,
        link: &mut impl Link,
        reply: impl FnOnce(&[usize]) -> Result<Vec<CheckResult>, String>,
    ) -> Verdicts {
        let Some(members) = self.exchanges.complete(id) else {
            return Vec::new(); // given up already (timed out, or the stream closed)
        };
        let counts: Vec<usize> = members.iter().map(|m| m.rules).collect();
        let mut verdicts = self.conclude(&members, reply(&counts), host, link);
        verdicts.extend(self.pump(host, link));
        verdicts
    }

    /// Sends exchanges while there is room and checks wait; the verdicts of those that
    /// could not leave.
    fn pump(&mut self, host: &impl Proxy, link: &mut impl Link) -> Verdicts {
        let mut verdicts = Vec::new();
        while let Some((id, body)) = self.take(host) {
            match self.send(id, &body, None, link) {
                Ok(Some(call)) => {
                    self.calls.insert(call.0, call.1);
                }
                Ok(None) => {}
                Err(reason) => verdicts.extend(self.fail(id, reason, host, link)),
            }
        }
        verdicts
    }

    fn take(&mut self, host: &impl Proxy) -> Option<(u32, String)> {
        // Only read the clock (a host call) when something will leave.
        let ready = self.exchanges.is_waiting() && self.exchanges.has_room();
        ready.then(|| self.exchanges.take(host.now_ms())).flatten()
    }

    /// Sends exchange `id` under the current configuration's backend (`owner`: the request
    /// whose own check it is); a callout or redis call to remember by its token.
    fn send(
        &mut self,
        id: u32,
        body: &str,
        owner: Option<u32>,
        link: &mut impl Link,
    ) -> Result<Option<(u32, Call)>, String> {
        let backend = &self
            .generations
            .last()
            .ok_or("no configuration")?
            .config
            .backend;
        let call = match backend.transport {
            Transport::Grpc => {
                let token = self
                    .stream
                    .as_ref()
                    .ok_or("no stream to the bridge (reconnecting)")?
                    .0;
                link.stream_send(token, id, body)?;
                None
            }
            Transport::Http => {
                let token = match owner {
                    Some(context_id) => link.own_callout(context_id, backend, body)?,
                    None => link.callout(backend, body)?,
                };
                Some((token, Call { id, redis: None }))
            }
            Transport::Redis => {
                let token = link.redis_call(backend, body, Invoke::Sha)?;
                let redis = Some((body.to_string(), Invoke::Sha));
                Some((token, Call { id, redis }))
            }
        };
        let http = backend.transport == Transport::Http;
        self.counters.exchange(http, body.lines().count());
        Ok(call)
    }

    /// Exchange `id` could not be sent or got no answer.
    fn fail(
        &mut self,
        id: u32,
        reason: String,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let members = self.exchanges.complete(id).unwrap_or_default();
        self.conclude(&members, Err(reason), host, link)
    }

    /// Fails every exchange in flight and every check waiting (the stream broke).
    fn abandon_all(&mut self, reason: &str, host: &impl Proxy, link: &mut impl Link) -> Verdicts {
        let lost = self.exchanges.abandon_all();
        let waiting = self.exchanges.drain_waiting();
        let mut verdicts = Vec::new();
        for members in lost.into_iter().chain([waiting]).filter(|m| !m.is_empty()) {
            verdicts.extend(self.conclude(&members, Err(reason.to_string()), host, link));
        }
        verdicts
    }

    /// Decides every member of an exchange from its reply (or why there is none), each
    /// check under the configuration it started with, the exchange counted by the current
    /// worker's breaker. Requests that went away meanwhile are skipped.
    fn conclude(
        &mut self,
        members: &[Member],
        reply: Result<Vec<CheckResult>, String>,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        self.settlements_answered(members, &reply, host);
        let Some((current, older)) = self.generations.split_last_mut() else {
            return Vec::new();
        };
        let mut taken: Vec<(u32, Option<Held>)> = members
            .iter()
            .map(|m| {
                let held = (m.context_id != NO_REQUEST)
                    .then(|| self.requests.remove(&m.context_id))
                    .flatten();
                (m.context_id, held)
            })
            .collect();
        let checks = taken
            .iter_mut()
            .zip(members)
            .map(|((_, held), member)| match (held, member.top_up) {
                (Some(held), _) => {
                    let config = older
                        .iter()
                        .find(|g| g.number == held.generation)
                        .map_or(&current.config, |g| &g.config);
                    Concluding::Check(config, &mut held.admission)
                }
                (None, Some(id)) => Concluding::TopUp(id),
                (None, None) => Concluding::Nothing,
            })
            .collect();
        let worker = &mut current.worker;
        let verdicts = conclude_exchange(&current.config, worker, host, reply, checks);
        let queued = queue_lease_lines(worker, &mut self.exchanges);
        if queued {
            self.wake_root(link);
        }
        let mut out = Vec::with_capacity(members.len());
        let now_ms = host.now_ms();
        for ((context_id, held), verdict) in taken.into_iter().zip(verdicts) {
            let (Some(mut held), Some(verdict)) = (held, verdict) else {
                // The request went away meanwhile: what its check may have taken goes back.
                if let Some(lines) = self.slots.answered(context_id) {
                    self.release_slots(lines, host, link);
                }
                continue;
            };
            if let Some(outcome) = held.admission.outcome {
                self.counters.add(outcome.counter(), 1);
            }
            let config = self.config_of(held.generation);
            if let Some(lines) = config.and_then(|c| held.admission.held_slots(c)) {
                self.counters.add(Counter::SlotsTaken, 1);
                self.slots.hold(context_id, lines, now_ms);
            }
            held.phase = Phase::Decided;
            self.requests.insert(context_id, held);
            out.push((context_id, verdict));
        }
        out
    }

    /// Asks for a wake-up if checks wait and may leave (an exchange slot is free).
    fn wake_if_waiting(&mut self, link: &mut impl Link) {
        if self.exchanges.is_waiting() && self.exchanges.has_room() {
            self.wake_root(link);
        }
    }

    /// Asks the host to wake the dispatcher right after the current callback (or, without
    /// queues, on a 1 ms tick).
    fn wake_root(&mut self, link: &mut impl Link) {
        if std::mem::replace(&mut self.wake_asked, true) {
            return;
        }
        if !link.post_wake() {
            link.set_tick(WAKE);
        }
    }

    /// Configuration `generation`, if it is still held.
    fn config_of(&self, generation: u64) -> Option<&Config> {
        let mut all = self.generations.iter();
        all.find(|g| g.number == generation).map(|g| &g.config)
    }
}

/// Queues what a worker's leases send on their own for the next exchange: their lease
/// returns, one line each, and their top-ups. No request waits for these. Whether anything
/// was queued.
fn queue_lease_lines(worker: &mut Worker, exchanges: &mut Exchanges) -> bool {
    let returns = worker.leases.take_returns();
    let top_ups = worker.leases.take_top_ups();
    let queued = !returns.is_empty() || !top_ups.is_empty();
    for back in &returns {
        let mut line = String::with_capacity(64);
        wire::encode_return(&mut line, &back.key, &back.limit, back.tokens);
        exchanges.enqueue(NO_REQUEST, 1, line);
    }
    for (id, line) in top_ups {
        exchanges.enqueue_top_up(id, line);
    }
    queued
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
