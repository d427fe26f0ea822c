//! The proxy-wasm binding: a root context per worker that owns the validated configuration,
//! the worker's circuit breaker, metrics and callout coalescing, and an HTTP context per
//! request that pauses on the bridge callout and resumes or replies.
//!
//! Host calls go through `proxy_wasm::hostcalls` so that every host error is handled here
//! instead of unwrapped: a panic would kill the VM and every request of its worker.

mod host;

use crate::batch::Batcher;
use crate::check::{decode_callout, Check, Start, Verdict, Worker};
use crate::config::Config;
use crate::protocol;
use crate::protocol::CheckResult;
use host::{callout_reply, carry_out, Metrics, ProxyHost};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// How often waiting checks are flushed into one callout.
const FLUSH_PERIOD: Duration = Duration::from_millis(1);

/// What every request of a worker shares; replaced whole on reconfiguration.
struct Shared {
    config: Config,
    worker: RefCell<Worker>,
    metrics: Metrics,
}

/// A check waiting for a batched callout (or its answer), held by the root on behalf of
/// its request; the configuration it started under goes with it.
struct Parked {
    shared: Rc<Shared>,
    check: Check,
    /// The verdict was carried out; the request picks up its response headers.
    settled: bool,
}

/// Checks that go to the bridge together. Lives as long as the worker, across
/// reconfigurations, so nothing waiting is ever forgotten.
#[derive(Default)]
struct Coalescer {
    batcher: RefCell<Batcher>,
    parked: RefCell<HashMap<u32, Parked>>,
}

#[derive(Default)]
struct Root {
    /// `None` until a configuration has been accepted.
    shared: Option<Rc<Shared>>,
    metrics: Option<Metrics>,
    coalescer: Rc<Coalescer>,
    /// Batched callouts in flight: their members (context id, rules sent), in body order.
    batches: HashMap<u32, Vec<(u32, usize)>>,
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let Some(members) = self.batches.remove(&token) else {
            return;
        };
        self.coalescer.batcher.borrow_mut().done();
        let (status, body) = callout_reply(num_headers, body_size);
        let counts: Vec<usize> = members.iter().map(|&(_, rules)| rules).collect();
        self.settle(&members, decode_callout(status, &body, &counts));
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match Config::parse(&bytes) {
            Ok(config) => {
                log::info!("configured {} rule(s)", config.rules.len());
                let metrics = *self.metrics.get_or_insert_with(Metrics::define);
                self.coalescer
                    .batcher
                    .borrow_mut()
                    .set_max_inflight(config.backend.max_inflight);
                self.shared = Some(Rc::new(Shared {
                    worker: RefCell::new(Worker::new(&config)),
                    config,
                    metrics,
                }));
                true
            }
            Err(e) => {
                log::error!("invalid plugin configuration: {e}");
                false
            }
        }
    }

    /// Sends the waiting checks as one callout, owned by the root so that no request's end
    /// can cancel it.
    fn on_tick(&mut self) {
        let batch = self.coalescer.batcher.borrow_mut().take_batch();
        if let Some((members, body)) = batch {
            self.send_batch(members, body);
        }
        if !self.coalescer.batcher.borrow().is_waiting() {
            let _ = hostcalls::set_tick_period(Duration::ZERO);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            shared: self.shared.clone()?,
            coalescer: Rc::clone(&self.coalescer),
            context_id,
            check: Check::default(),
            phase: Phase::Idle,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Root {
    fn send_batch(&mut self, members: Vec<u32>, body: String) {
        let (members, shared) = {
            let parked = self.coalescer.parked.borrow();
            let members: Vec<(u32, usize)> = members
                .iter()
                .map(|id| (*id, parked.get(id).map_or(0, |p| p.check.rule_count())))
                .collect();
            // Any member's configuration will do: a reconfiguration keeps the backend.
            let shared = members
                .iter()
                .find_map(|(id, _)| parked.get(id))
                .map(|p| Rc::clone(&p.shared));
            (members, shared)
        };
        let Some(shared) = shared else {
            self.coalescer.batcher.borrow_mut().done();
            return;
        };
        match dispatch(&shared, &body) {
            Ok(token) => {
                shared.metrics.callout();
                self.batches.insert(token, members);
            }
            Err(reason) => {
                self.coalescer.batcher.borrow_mut().done();
                self.settle(&members, Err(reason));
            }
        }
    }

    /// Decides every member of a batch from the bridge's reply (or why there is none),
    /// then resumes or answers each on its own context.
    fn settle(&mut self, members: &[(u32, usize)], reply: Result<Vec<CheckResult>, String>) {
        let mut results: Vec<Result<CheckResult, String>> = match reply {
            Ok(results) => results.into_iter().map(Ok).collect(),
            Err(reason) => vec![Err(reason); members.len()],
        };
        // Decide first, then act: carrying out a verdict may re-enter the filter.
        let mut verdicts = Vec::with_capacity(members.len());
        if let Ok(mut parked) = self.coalescer.parked.try_borrow_mut() {
            for (&(context_id, _), result) in members.iter().zip(results.drain(..)) {
                let Some(p) = parked.get_mut(&context_id) else {
                    continue; // the request went away meanwhile
                };
                let shared = Rc::clone(&p.shared);
                let verdict = with_worker(&shared, |worker| {
                    p.check.conclude(&shared.config, worker, &ProxyHost, result)
                });
                p.settled = true;
                shared.metrics.count(p.check.outcome);
                verdicts.push((context_id, verdict));
            }
        }
        for (context_id, verdict) in verdicts {
            if hostcalls::set_effective_context(context_id).is_ok() {
                carry_out(&verdict);
            }
        }
    }
}

/// Where a request's check stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Its own callout is in flight.
    Calling,
    /// Waiting in (or answered through) a batch held by the root.
    Parked,
    Done,
}

struct Request {
    shared: Rc<Shared>,
    coalescer: Rc<Coalescer>,
    context_id: u32,
    check: Check,
    phase: Phase,
}

/// Runs `f` on the worker state; a re-entrant borrow (impossible in a single-threaded VM,
/// but never worth a panic) gets a throwaway worker.
fn with_worker<T>(shared: &Shared, f: impl FnOnce(&mut Worker) -> T) -> T {
    match shared.worker.try_borrow_mut() {
        Ok(mut worker) => f(&mut worker),
        Err(_) => f(&mut Worker::new(&shared.config)),
    }
}

/// Sends a callout of `body` to the bridge from the current context.
fn dispatch(shared: &Shared, body: &str) -> Result<u32, String> {
    let backend = &shared.config.backend;
    let headers = vec![
        (":method", "POST"),
        (":path", protocol::PATH),
        (":authority", backend.authority.as_str()),
        ("content-type", "text/plain"),
    ];
    let timeout = Duration::from_millis(backend.timeout_ms);
    hostcalls::dispatch_http_call(
        &backend.cluster,
        headers,
        Some(body.as_bytes()),
        vec![],
        timeout,
    )
    .map_err(|e| format!("dispatch failed: {e:?}"))
}

impl Request {
    /// Carries out a verdict reached before pausing.
    fn act_now(&mut self, verdict: Verdict) -> Action {
        self.phase = Phase::Done;
        self.shared.metrics.count(self.check.outcome);
        match verdict {
            Verdict::Resume => Action::Continue,
            Verdict::Reply(_) => {
                carry_out(&verdict);
                Action::Pause
            }
        }
    }

    /// Hands the check to the root, to leave with the next batch.
    fn park(&mut self, body: String) -> Action {
        let check = std::mem::take(&mut self.check);
        let parked = Parked {
            shared: Rc::clone(&self.shared),
            check,
            settled: false,
        };
        self.coalescer
            .parked
            .borrow_mut()
            .insert(self.context_id, parked);
        let mut batcher = self.coalescer.batcher.borrow_mut();
        let first = !batcher.is_waiting();
        batcher.enqueue(self.context_id, body);
        if first {
            let _ = hostcalls::set_tick_period(FLUSH_PERIOD);
        }
        self.phase = Phase::Parked;
        Action::Pause
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        self.coalescer.batcher.borrow_mut().done();
        self.phase = Phase::Done;
        let (status, body) = callout_reply(num_headers, body_size);
        let verdict = with_worker(&self.shared, |worker| {
            self.check
                .finish(&self.shared.config, worker, &ProxyHost, status, &body)
        });
        self.shared.metrics.count(self.check.outcome);
        carry_out(&verdict);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let start = with_worker(&shared, |worker| {
            self.check.start(&shared.config, worker, &ProxyHost)
        });
        let body = match start {
            Start::Skip => return Action::Continue,
            Start::Decided(verdict) => return self.act_now(verdict),
            Start::Callout(body) => body,
        };
        if !self.coalescer.batcher.borrow_mut().try_send() {
            return self.park(body);
        }
        match dispatch(&shared, &body) {
            Ok(_) => {
                shared.metrics.callout();
                self.phase = Phase::Calling;
                Action::Pause
            }
            Err(reason) => {
                self.coalescer.batcher.borrow_mut().done();
                let verdict = with_worker(&shared, |worker| {
                    self.check.fail(&shared.config, worker, &ProxyHost, &reason)
                });
                self.act_now(verdict)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.phase == Phase::Parked {
            if let Ok(mut parked) = self.coalescer.parked.try_borrow_mut() {
                if let Some(p) = parked.remove(&self.context_id).filter(|p| p.settled) {
                    self.check = p.check;
                    self.phase = Phase::Done;
                }
            }
        }
        for (name, value) in &self.check.response_headers {
            if let Err(e) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
                log::warn!("adding {name} failed: {e:?}");
            }
        }
        Action::Continue
    }
}

impl Drop for Request {
    /// The stream is gone: its waiting check leaves the queue, and its own callout (which
    /// the host cancels with it) stops counting as in flight.
    fn drop(&mut self) {
        match self.phase {
            Phase::Parked => {
                if let Ok(mut parked) = self.coalescer.parked.try_borrow_mut() {
                    parked.remove(&self.context_id);
                }
                if let Ok(mut batcher) = self.coalescer.batcher.try_borrow_mut() {
                    batcher.remove(self.context_id);
                }
            }
            Phase::Calling => {
                if let Ok(mut batcher) = self.coalescer.batcher.try_borrow_mut() {
                    batcher.done();
                }
            }
            Phase::Idle | Phase::Done => {}
        }
    }
}
