//! The proxy-wasm binding: a root context per worker that owns the validated configuration,
//! the transport to the bridge (a gRPC stream or HTTP callouts) and the worker's group
//! commit, and an HTTP context per request that pauses while its check is out.
//!
//! The decisions are plain Rust (`check`, `exchange`); this module only moves bytes and
//! calls between them and the host. Host calls go through `proxy_wasm::hostcalls` (or the
//! raw ABI in `transport`) so that every host error is handled instead of unwrapped: a
//! panic would kill the VM and every request of its worker.

mod host;
mod transport;

use crate::backend::Transport;
use crate::check::{conclude_exchange, decode_callout, Check, Host, Start, Verdict, Worker};
use crate::config::Config;
use crate::exchange::{Exchanges, Member};
use crate::protocol::{self, CheckResult};
use hashbrown::HashMap;
use host::{callout_reply, carry_out, Metrics, ProxyHost};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// The tick that wakes the root to send waiting checks (HTTP transport only, when the
/// exchange that came back was a request's own callout).
const WAKE: Duration = Duration::from_millis(1);
/// Longest wait before reopening a stream that keeps closing.
const MAX_REOPEN_BACKOFF_MS: u64 = 5_000;

/// What every request of a worker shares under one configuration; replaced whole on
/// reconfiguration.
struct Shared {
    config: Config,
    worker: RefCell<Worker>,
}

/// A check held on behalf of its request while it is out; the configuration it started
/// under goes with it.
struct Parked {
    shared: Rc<Shared>,
    check: Check,
    /// The verdict was carried out; the request picks up its response headers.
    settled: bool,
}

/// Verdicts to carry out, by request context id.
type Verdicts = Vec<(u32, Verdict)>;
/// An HTTP callout in flight: its token and exchange id.
type Callout = (u32, u32);

/// What lives as long as the worker, across reconfigurations, so that nothing in flight or
/// waiting is ever forgotten.
#[derive(Default)]
struct Hub {
    exchanges: RefCell<Exchanges>,
    parked: RefCell<HashMap<u32, Parked>>,
    /// The open gRPC stream to the bridge, if any.
    stream: Cell<Option<u32>>,
    /// The root was asked to tick soon and send what waits.
    wake_asked: Cell<bool>,
    metrics: OnceCell<Metrics>,
}

impl Hub {
    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get()
    }

    /// Asks the root to send the waiting checks at its next tick (1 ms away).
    fn wake_root(&self) {
        if !self.wake_asked.replace(true) {
            let _ = hostcalls::set_tick_period(WAKE);
        }
    }

    /// Sends exchanges while there is room and checks wait; from the root, or from a
    /// request on the stream transport (whose replies always reach the root). Returns the
    /// HTTP callouts sent (token, exchange id) and the verdicts of exchanges that could not
    /// leave.
    fn pump(&self, shared: &Shared) -> (Vec<Callout>, Verdicts) {
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

    fn take(&self) -> Option<(u32, String)> {
        let mut exchanges = self.exchanges.try_borrow_mut().ok()?;
        // Only read the clock (a host call) when something will leave.
        (exchanges.is_waiting() && exchanges.has_room())
            .then(|| exchanges.take(ProxyHost.now_ms()))
            .flatten()
    }

    fn send(&self, shared: &Shared, id: u32, body: &str) -> Result<Option<u32>, String> {
        let backend = &shared.config.backend;
        let sent = transport::send(backend, self.stream.get(), id, body)?;
        if let Some(metrics) = self.metrics() {
            metrics.exchange(backend.transport == Transport::Http, body.lines().count());
        }
        Ok(sent)
    }

    /// Exchange `id` could not be sent or got no answer.
    fn fail(&self, shared: &Shared, id: u32, reason: String) -> Verdicts {
        let members = self.complete(id).unwrap_or_default();
        self.settle(shared, &members, Err(reason))
    }

    fn complete(&self, id: u32) -> Option<Vec<Member>> {
        self.exchanges.try_borrow_mut().ok()?.complete(id)
    }

    /// Decides every member of an exchange from its reply (or why there is none). The
    /// verdicts are returned, not carried out: carrying one out may re-enter the filter,
    /// so the caller does it once nothing here is borrowed.
    fn settle(
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
            .map(|(_, p)| {
                p.as_mut()
                    .map(|Parked { shared, check, .. }| (&shared.config, check))
            })
            .collect();
        let verdicts = with_worker(shared, |worker| {
            conclude_exchange(&shared.config, worker, &ProxyHost, reply, checks)
        });
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

/// Carries out verdicts on their (paused) requests.
fn carry_out_all(verdicts: &[(u32, Verdict)]) {
    for (context_id, verdict) in verdicts {
        if hostcalls::set_effective_context(*context_id).is_ok() {
            carry_out(verdict);
        }
    }
}

/// Runs `f` on the worker state; a re-entrant borrow (impossible in a single-threaded VM,
/// but never worth a panic) gets a throwaway worker.
fn with_worker<T>(shared: &Shared, f: impl FnOnce(&mut Worker) -> T) -> T {
    match shared.worker.try_borrow_mut() {
        Ok(mut worker) => f(&mut worker),
        Err(_) => f(&mut Worker::new(&shared.config)),
    }
}

#[derive(Default)]
struct Root {
    hub: Rc<Hub>,
    /// `None` until a configuration has been accepted.
    shared: Option<Rc<Shared>>,
    /// HTTP callouts the root sent: token to exchange id.
    callouts: HashMap<u32, u32>,
    /// The cluster the open stream goes to.
    stream_cluster: String,
    /// Reopening a closed stream waits this long (doubling while it keeps closing).
    reopen_backoff_ms: u64,
    reopen_at_ms: u64,
}

impl Root {
    /// The tick that times out stream exchanges, reopens the stream and flushes counters.
    fn base_tick(config: &Config) -> Duration {
        Duration::from_millis((config.backend.timeout_ms / 4).clamp(1, 100))
    }

    fn open_stream(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        match transport::open_stream(&shared.config.backend) {
            Ok(token) => {
                self.hub.stream.set(Some(token));
                self.stream_cluster = shared.config.backend.cluster.clone();
            }
            Err(e) => {
                log::warn!("{e}");
                self.schedule_reopen();
            }
        }
    }

    fn schedule_reopen(&mut self) {
        self.reopen_backoff_ms = (self.reopen_backoff_ms * 2).clamp(100, MAX_REOPEN_BACKOFF_MS);
        self.reopen_at_ms = ProxyHost.now_ms() + self.reopen_backoff_ms;
    }

    /// Sends what waits and remembers the callouts this root now owns.
    fn pump(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let (callouts, verdicts) = self.hub.pump(&shared);
        self.callouts.extend(callouts);
        carry_out_all(&verdicts);
    }

    /// Settles exchange `id` from its reply, then sends what waits at once: group commit.
    fn answered(
        &mut self,
        id: u32,
        reply: impl FnOnce(&[usize]) -> Result<Vec<CheckResult>, String>,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Some(members) = self.hub.complete(id) else {
            return; // given up already (timed out, or the stream closed)
        };
        let counts: Vec<usize> = members.iter().map(|m| m.rules).collect();
        let verdicts = self.hub.settle(&shared, &members, reply(&counts));
        carry_out_all(&verdicts);
        self.pump();
    }

    /// Fails every exchange in flight and every check waiting (the stream broke).
    fn abandon_all(&mut self, reason: &str) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let (lost, waiting) = match self.hub.exchanges.try_borrow_mut() {
            Ok(mut x) => (x.abandon_all(), x.drain_waiting()),
            Err(_) => return,
        };
        let mut verdicts = Vec::new();
        for members in lost.into_iter().chain([waiting]).filter(|m| !m.is_empty()) {
            verdicts.extend(self.hub.settle(&shared, &members, Err(reason.to_string())));
        }
        carry_out_all(&verdicts);
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let Some(id) = self.callouts.remove(&token) else {
            return;
        };
        let (status, body) = callout_reply(num_headers, body_size);
        self.answered(id, |counts| decode_callout(status, &body, counts));
    }

    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        if self.hub.stream.get() != Some(token) {
            return;
        }
        let message = transport::stream_message(size);
        let Some((id, body)) = protocol::split_message(&message) else {
            log::warn!("bridge sent a stream message without an exchange id");
            return; // its exchange times out
        };
        self.reopen_backoff_ms = 0;
        self.answered(id, |counts| {
            protocol::decode_reply(body, counts).map_err(|bad| bad.0.to_string())
        });
    }

    fn on_grpc_stream_close(&mut self, token: u32, status: u32) {
        transport::close_stream(token);
        if self.hub.stream.get() != Some(token) {
            return;
        }
        self.hub.stream.set(None);
        self.abandon_all(&format!(
            "stream to the bridge closed (gRPC status {status})"
        ));
        if self.reopen_backoff_ms == 0 {
            self.schedule_reopen();
            self.open_stream();
        } else {
            self.schedule_reopen();
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(config) => config,
            Err(e) => {
                log::error!("invalid plugin configuration: {e}");
                return false;
            }
        };
        log::info!("configured {} rule(s)", config.rules.len());
        let _ = self.hub.metrics.get_or_init(Metrics::define);
        if let Ok(mut x) = self.hub.exchanges.try_borrow_mut() {
            x.set_max_inflight(config.backend.max_inflight);
        }
        let _ = hostcalls::set_tick_period(Root::base_tick(&config));
        let backend = config.backend.clone();
        self.shared = Some(Rc::new(Shared {
            worker: RefCell::new(Worker::new(&config)),
            config,
        }));
        let stream = self.hub.stream.get();
        let wanted = backend.transport == Transport::Grpc;
        if let Some(token) = stream.filter(|_| !wanted || self.stream_cluster != backend.cluster) {
            self.hub.stream.set(None);
            transport::close_stream(token);
            self.abandon_all("the bridge's cluster changed");
        }
        if wanted && self.hub.stream.get().is_none() {
            self.reopen_backoff_ms = 0;
            self.open_stream();
        }
        true
    }

    /// The safety net: gives up stream exchanges past `timeout_ms`, reopens the stream,
    /// sends what waits, flushes the counters.
    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let now = ProxyHost.now_ms();
        let backend = &shared.config.backend;
        if backend.transport == Transport::Grpc {
            let late = match self.hub.exchanges.try_borrow_mut() {
                Ok(mut x) => x.expire(now, backend.timeout_ms),
                Err(_) => Vec::new(),
            };
            let mut verdicts = Vec::new();
            for members in late {
                let reason = Err("no answer within timeout_ms".to_string());
                verdicts.extend(self.hub.settle(&shared, &members, reason));
            }
            carry_out_all(&verdicts);
            if self.hub.stream.get().is_none() && now >= self.reopen_at_ms {
                self.open_stream();
            }
        }
        self.pump();
        if self.hub.wake_asked.replace(false) {
            let _ = hostcalls::set_tick_period(Root::base_tick(&shared.config));
        }
        if let Some(metrics) = self.hub.metrics() {
            metrics.flush();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            shared: self.shared.clone()?,
            hub: Rc::clone(&self.hub),
            context_id,
            check: Check::default(),
            phase: Phase::Idle,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Where a request's check stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Held by the hub: waiting, out, or answered.
    Parked,
    /// Parked, and out in this request's own HTTP callout (exchange id).
    Carrying(u32),
    Done,
}

struct Request {
    shared: Rc<Shared>,
    hub: Rc<Hub>,
    context_id: u32,
    check: Check,
    phase: Phase,
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

    /// Hands the check to the hub and sends it if there is room: on the stream with any
    /// other waiting check; over HTTP only as this request's own callout, since a batch
    /// must be sent by the root to get its reply whatever becomes of this request.
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
        let own_callout = match self.hub.exchanges.try_borrow_mut() {
            Ok(mut x) => {
                x.enqueue(self.context_id, rules, line);
                let http = self.shared.config.backend.transport == Transport::Http;
                (!http || x.only_waiting(self.context_id)) && x.has_room()
            }
            Err(_) => false,
        };
        self.phase = Phase::Parked;
        let verdicts = match (self.shared.config.backend.transport, own_callout) {
            (_, false) => {
                if self.shared.config.backend.transport == Transport::Http {
                    self.hub.wake_root_if_room();
                }
                return Action::Pause;
            }
            (Transport::Grpc, true) => self.hub.pump(&self.shared).1,
            (Transport::Http, true) => {
                let Some((id, body)) = self.hub.take() else {
                    return Action::Pause;
                };
                match self.hub.send(&self.shared, id, &body) {
                    Ok(_) => {
                        self.phase = Phase::Carrying(id);
                        return Action::Pause;
                    }
                    Err(reason) => self.hub.fail(&self.shared, id, reason),
                }
            }
        };
        self.carry_out_settled(verdicts)
    }

    /// Carries out verdicts reached while this request is running: its own becomes the
    /// returned action, the others go to their contexts.
    fn carry_out_settled(&mut self, verdicts: Verdicts) -> Action {
        let (own, others): (Vec<_>, Vec<_>) = verdicts
            .into_iter()
            .partition(|(id, _)| *id == self.context_id);
        carry_out_all(&others);
        if !others.is_empty() {
            let _ = hostcalls::set_effective_context(self.context_id);
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

impl Hub {
    /// HTTP transport: the root sends waiting checks when an exchange slot is free.
    fn wake_root_if_room(&self) {
        let ready = self
            .exchanges
            .try_borrow()
            .is_ok_and(|x| x.is_waiting() && x.has_room());
        if ready {
            self.wake_root();
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
        let reply = decode_callout(status, &body, &counts);
        let verdicts = self.hub.settle(&self.shared, &members, reply);
        carry_out_all(&verdicts);
        self.hub.wake_root_if_room();
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let shared = Rc::clone(&self.shared);
        let start = with_worker(&shared, |worker| {
            self.check.start(&shared.config, worker, &ProxyHost)
        });
        match start {
            Start::Skip => Action::Continue,
            Start::Decided(verdict) => self.act_now(verdict),
            Start::Ask(line) => self.park(line),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if matches!(self.phase, Phase::Parked | Phase::Carrying(_)) {
            self.take_settled();
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
    /// The stream is gone: its waiting check leaves the queue, and its own callout (whose
    /// reply will find no one) stops holding an exchange slot.
    fn drop(&mut self) {
        if let Ok(mut parked) = self.hub.parked.try_borrow_mut() {
            parked.remove(&self.context_id);
        }
        if let Ok(mut x) = self.hub.exchanges.try_borrow_mut() {
            x.forget(self.context_id);
            if let Phase::Carrying(id) = self.phase {
                x.complete(id);
            }
        }
        if matches!(self.phase, Phase::Carrying(_)) {
            self.hub.wake_root_if_room();
        }
    }
}
