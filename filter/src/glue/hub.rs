//! What a worker shares across its contexts and configurations: the checks held for
//! paused requests, the group-commit bookkeeping, the stream token, the counters; and how
//! an exchange is sent, failed and settled. The root and the requests both act through it.

use super::abi;
use super::host::{carry_out, Metrics, ProxyHost, RuleMetrics};
use super::transport;
use crate::check::{conclude_exchange, Admission, Concluding, Verdict, Worker};
use crate::exchange::{Exchanges, Member, NO_REQUEST};
use crate::host::Proxy;
use crate::protocol::{self, CheckResult};
use hashbrown::HashMap;
use ratelimit_config::backend::Transport;
use ratelimit_config::config::Config;
use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::time::Duration;

/// The tick that wakes the root to send waiting checks where the host has no shared
/// queue to post to.
const WAKE: Duration = Duration::from_millis(1);

/// What every request of a worker shares under one configuration; replaced whole on
/// reconfiguration.
pub(super) struct Shared {
    pub(super) config: Config,
    pub(super) worker: RefCell<Worker>,
    /// The host metrics of the per-rule counters of `config`'s rules.
    pub(super) rule_metrics: RuleMetrics,
}

impl Shared {
    pub(super) fn new(config: Config) -> Shared {
        Shared {
            worker: RefCell::new(Worker::new(&config)),
            rule_metrics: RuleMetrics::define(&config),
            config,
        }
    }

    /// Hands the per-rule counts to the host.
    pub(super) fn flush_rule_counts(&self) {
        if let Ok(mut worker) = self.worker.try_borrow_mut() {
            self.rule_metrics.flush(&mut worker.rule_counts);
        }
    }
}

impl Drop for Shared {
    /// A replaced configuration lives on while checks it started are out; what they count
    /// after the last tick of its life is handed over when the last of them ends.
    fn drop(&mut self) {
        self.flush_rule_counts();
    }
}

/// A check held on behalf of its request while it is out; the configuration it started
/// under goes with it.
pub(super) struct Parked {
    pub(super) shared: Rc<Shared>,
    pub(super) check: Admission,
    /// The verdict was carried out; the request picks up its response headers.
    pub(super) settled: bool,
}

/// Verdicts to carry out, by request context id.
pub(super) type Verdicts = Vec<(u32, Verdict)>;
/// An HTTP callout in flight: its token and exchange id.
pub(super) type Callout = (u32, u32);

/// What lives as long as the worker, across reconfigurations, so that nothing in flight or
/// waiting is ever forgotten.
#[derive(Default)]
pub(super) struct Hub {
    /// The accepted configuration; `None` until one is.
    pub(super) shared: RefCell<Option<Rc<Shared>>>,
    pub(super) exchanges: RefCell<Exchanges>,
    /// HTTP callouts the root sent: token to exchange id.
    pub(super) callouts: RefCell<HashMap<u32, u32>>,
    /// Redis calls in flight, by token (the redis-call build).
    #[cfg(feature = "redis-call")]
    pub(super) redis_calls: RefCell<HashMap<u32, super::redis_host::Sent>>,
    pub(super) parked: RefCell<HashMap<u32, Parked>>,
    /// The open gRPC stream to the bridge, if any.
    pub(super) stream: Cell<Option<u32>>,
    /// This worker's queue for waking the root (HTTP transport), once registered.
    pub(super) wake_queue: Cell<Option<u32>>,
    /// The root was asked to wake up and send what waits.
    pub(super) wake_asked: Cell<bool>,
    pub(super) metrics: OnceCell<Metrics>,
}

impl Hub {
    pub(super) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get()
    }

    pub(super) fn shared(&self) -> Option<Rc<Shared>> {
        self.shared.try_borrow().ok()?.clone()
    }

    /// Sends what waits from a root callback, remembering the HTTP callouts sent (their
    /// replies come to the root), and carries out the verdicts of exchanges that could not
    /// leave.
    pub(super) fn pump_from_root(&self, shared: &Shared) {
        let (callouts, verdicts) = self.pump(shared);
        if let Ok(mut known) = self.callouts.try_borrow_mut() {
            known.extend(callouts);
        }
        carry_out_all(&verdicts);
    }

    /// Settles exchange `id` from its reply (from a root callback), then sends what waits
    /// at once: group commit.
    pub(super) fn answered(
        &self,
        id: u32,
        reply: impl FnOnce(&[usize]) -> Result<Vec<CheckResult>, String>,
    ) {
        let Some(shared) = self.shared() else {
            return;
        };
        let Some(members) = self.complete(id) else {
            return; // given up already (timed out, or the stream closed)
        };
        let counts: Vec<usize> = members.iter().map(|m| m.rules).collect();
        let verdicts = self.settle(&shared, &members, reply(&counts));
        carry_out_all(&verdicts);
        self.pump_from_root(&shared);
    }

    /// Asks the root to send the waiting checks: a post to its queue, run by the host's
    /// event loop right after the current callback (or, without queues, a 1 ms tick).
    pub(super) fn wake_root(&self) {
        if self.wake_asked.replace(true) {
            return;
        }
        let posted = self.wake_queue.get().is_some_and(transport::post);
        if !posted {
            let _ = abi::set_tick_period(WAKE);
        }
    }

    /// HTTP transport: the root sends waiting checks when an exchange slot is free.
    pub(super) fn wake_root_if_room(&self) {
        let ready = self
            .exchanges
            .try_borrow()
            .is_ok_and(|x| x.is_waiting() && x.has_room());
        if ready {
            self.wake_root();
        }
    }

    /// Sends exchanges while there is room and checks wait; from the root, or from a
    /// request on the stream transport (whose replies always reach the root). Returns the
    /// HTTP callouts sent (token, exchange id) and the verdicts of exchanges that could not
    /// leave.
    pub(super) fn pump(&self, shared: &Shared) -> (Vec<Callout>, Verdicts) {
        let (mut callouts, mut verdicts) = (Vec::new(), Vec::new());
        while let Some((id, body)) = self.take() {
            match self.send(shared, id, &body) {
                Ok(Some(token)) => callouts.push((token, id)),
                Ok(None) => {}
                Err(reason) => verdicts.extend(self.fail(shared, id, reason)),
            }
        }
        (callouts, verdicts)
    }

    pub(super) fn take(&self) -> Option<(u32, String)> {
        let mut exchanges = self.exchanges.try_borrow_mut().ok()?;
        // Only read the clock (a host call) when something will leave.
        (exchanges.is_waiting() && exchanges.has_room())
            .then(|| exchanges.take(ProxyHost::default().now_ms()))
            .flatten()
    }

    pub(super) fn send(&self, shared: &Shared, id: u32, body: &str) -> Result<Option<u32>, String> {
        let backend = &shared.config.backend;
        let sent = match backend.transport {
            // The call's reply comes to the root's `proxy_on_redis_call_response`.
            #[cfg(feature = "redis-call")]
            Transport::Redis => {
                let invoke = crate::redis_call::Invoke::Sha;
                super::redis_host::send(&self.redis_calls, backend, id, body.to_string(), invoke)
                    .map(|()| None)?
            }
            _ => transport::send(backend, self.stream.get(), id, body)?,
        };
        if let Some(metrics) = self.metrics() {
            metrics.exchange(backend.transport == Transport::Http, body.lines().count());
        }
        Ok(sent)
    }

    /// Exchange `id` could not be sent or got no answer.
    pub(super) fn fail(&self, shared: &Shared, id: u32, reason: String) -> Verdicts {
        let members = self.complete(id).unwrap_or_default();
        self.settle(shared, &members, Err(reason))
    }

    pub(super) fn complete(&self, id: u32) -> Option<Vec<Member>> {
        self.exchanges.try_borrow_mut().ok()?.complete(id)
    }

    /// Decides every member of an exchange from its reply (or why there is none). The
    /// verdicts are returned, not carried out: carrying one out may re-enter the filter,
    /// so the caller does it once nothing here is borrowed.
    pub(super) fn settle(
        &self,
        shared: &Shared,
        members: &[Member],
        reply: Result<Vec<CheckResult>, String>,
    ) -> Verdicts {
        let Ok(mut parked) = self.parked.try_borrow_mut() else {
            return Vec::new();
        };
        let mut taken: Vec<(u32, Option<Parked>)> = members
            .iter()
            .map(|m| (m.context_id, parked.remove(&m.context_id)))
            .collect();
        let checks = taken
            .iter_mut()
            .zip(members)
            .map(|((_, p), member)| match (p, member.top_up) {
                (Some(Parked { shared, check, .. }), _) => Concluding::Check(&shared.config, check),
                (None, Some(id)) => Concluding::TopUp(id),
                (None, None) => Concluding::Nothing,
            })
            .collect();
        let verdicts = with_worker(shared, |worker| {
            conclude_exchange(&shared.config, worker, &ProxyHost::default(), reply, checks)
        });
        self.queue_lease_lines(shared);
        let mut out = Vec::with_capacity(members.len());
        for ((context_id, p), verdict) in taken.into_iter().zip(verdicts) {
            let (Some(mut p), Some(verdict)) = (p, verdict) else {
                continue; // the request went away meanwhile
            };
            if let Some(metrics) = self.metrics() {
                metrics.count(p.check.outcome);
            }
            p.settled = true;
            parked.insert(context_id, p);
            out.push((context_id, verdict));
        }
        out
    }
}

impl Hub {
    /// Queues what the worker's leases send on their own for the next exchange (sent by
    /// the root, which is asked to wake): the tokens they give back, one line each, and
    /// their top-ups. No request waits for these.
    pub(super) fn queue_lease_lines(&self, shared: &Shared) {
        let (returns, top_ups) = with_worker(shared, |worker| {
            (worker.leases.take_returns(), worker.leases.take_top_ups())
        });
        if returns.is_empty() && top_ups.is_empty() {
            return;
        }
        if let Ok(mut x) = self.exchanges.try_borrow_mut() {
            for back in &returns {
                let mut line = String::with_capacity(64);
                protocol::encode_return(&mut line, &back.key, &back.limit, back.tokens);
                x.enqueue(NO_REQUEST, 1, line);
            }
            for (id, line) in top_ups {
                x.enqueue_top_up(id, line);
            }
        }
        self.wake_root();
    }
}

/// Carries out verdicts on their (paused) requests.
pub(super) fn carry_out_all(verdicts: &[(u32, Verdict)]) {
    for (context_id, verdict) in verdicts {
        if abi::set_effective_context(*context_id).is_ok() {
            carry_out(verdict);
        }
    }
}

/// Runs `f` on the worker state; a re-entrant borrow (impossible in a single-threaded VM,
/// but never worth a panic) gets a throwaway worker.
pub(super) fn with_worker<T>(shared: &Shared, f: impl FnOnce(&mut Worker) -> T) -> T {
    match shared.worker.try_borrow_mut() {
        Ok(mut worker) => f(&mut worker),
        Err(_) => f(&mut Worker::new(&shared.config)),
    }
}
