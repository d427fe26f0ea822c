//! The proxy-wasm binding: a root context per worker that owns the validated configuration,
//! the worker's circuit breaker and metrics, and an HTTP context per request that pauses on
//! the bridge callout and resumes or replies.
//!
//! Host calls go through `proxy_wasm::hostcalls` so that every host error is handled here
//! instead of unwrapped: a panic would kill the VM and every request of its worker.

use crate::check::{Check, Host, Outcome, Start, Verdict, Worker};
use crate::config::Config;
use crate::identity::RequestView;
use crate::local::SharedData;
use crate::protocol;
use crate::response::LocalReply;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// Counters exposed by the host (Envoy: `wasmcustom.ratelimit.*` in `/stats`).
#[derive(Default, Clone, Copy)]
struct Metrics {
    callouts: Option<u32>,
    allowed: Option<u32>,
    denied: Option<u32>,
    backend_failures: Option<u32>,
    short_circuits: Option<u32>,
}

impl Metrics {
    fn define() -> Metrics {
        let counter = |name| hostcalls::define_metric(MetricType::Counter, name).ok();
        Metrics {
            callouts: counter("ratelimit.callouts"),
            allowed: counter("ratelimit.allowed"),
            denied: counter("ratelimit.denied"),
            backend_failures: counter("ratelimit.backend_failures"),
            short_circuits: counter("ratelimit.short_circuits"),
        }
    }

    fn bump(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    fn count(&self, outcome: Option<Outcome>) {
        Metrics::bump(match outcome {
            Some(Outcome::Allowed) => self.allowed,
            Some(Outcome::Denied) => self.denied,
            Some(Outcome::BackendFailed) => self.backend_failures,
            Some(Outcome::ShortCircuited) => self.short_circuits,
            None => None,
        });
    }
}

/// What every request of a worker shares; replaced whole on reconfiguration.
struct Shared {
    config: Config,
    worker: RefCell<Worker>,
    metrics: Metrics,
}

#[derive(Default)]
struct Root {
    /// `None` until a configuration has been accepted.
    shared: Option<Rc<Shared>>,
    metrics: Option<Metrics>,
}

impl Context for Root {}

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

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            shared: self.shared.clone()?,
            check: Check::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    shared: Rc<Shared>,
    check: Check,
}

/// The host as the filter's logic sees it, for the current request.
struct ProxyHost;

impl RequestView for ProxyHost {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        hostcalls::get_property(vec!["source", "address"])
            .ok()
            .flatten()
    }
}

impl SharedData for ProxyHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), cas)) => Some((value, cas.unwrap_or(0))),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        hostcalls::set_shared_data(key, Some(value), (cas != 0).then_some(cas)).is_ok()
    }
}

impl Host for ProxyHost {
    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

fn send(reply: &LocalReply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    if let Err(e) =
        hostcalls::send_http_response(reply.status, headers, Some(reply.body.as_bytes()))
    {
        log::warn!("local reply failed: {e:?}");
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

impl Request {
    /// Carries out a verdict on a paused request.
    fn resume_with(&mut self, verdict: Verdict) {
        self.shared.metrics.count(self.check.outcome);
        match verdict {
            Verdict::Resume => {
                if let Err(e) = hostcalls::resume_http_request() {
                    log::warn!("resume failed: {e:?}");
                }
            }
            Verdict::Reply(reply) => send(&reply),
        }
    }

    /// Carries out a verdict reached before pausing.
    fn act_now(&mut self, verdict: Verdict) -> Action {
        self.shared.metrics.count(self.check.outcome);
        match verdict {
            Verdict::Resume => Action::Continue,
            Verdict::Reply(reply) => {
                send(&reply);
                Action::Pause
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        // A reset callout comes back with no headers, and then Envoy has no reply map at
        // all: reading it answers BadArgument, on which the SDK panics. Don't ask.
        let status = (num_headers > 0)
            .then(|| hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status"))
            .and_then(|r| r.ok().flatten())
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok());
        let size = body_size.min(protocol::MAX_REPLY_LEN + 1);
        let body = (size > 0)
            .then(|| hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size))
            .and_then(|r| r.ok().flatten())
            .unwrap_or_default();
        let verdict = with_worker(&self.shared, |worker| {
            self.check
                .finish(&self.shared.config, worker, &ProxyHost, status, &body)
        });
        self.resume_with(verdict);
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
        let backend = &shared.config.backend;
        let headers = vec![
            (":method", "POST"),
            (":path", protocol::PATH),
            (":authority", backend.authority.as_str()),
            ("content-type", "text/plain"),
        ];
        let timeout = Duration::from_millis(backend.timeout_ms);
        match hostcalls::dispatch_http_call(
            &backend.cluster,
            headers,
            Some(body.as_bytes()),
            vec![],
            timeout,
        ) {
            Ok(_) => {
                Metrics::bump(shared.metrics.callouts);
                Action::Pause
            }
            Err(e) => {
                let reason = format!("dispatch failed: {e:?}");
                let verdict = with_worker(&shared, |worker| {
                    self.check.fail(&shared.config, worker, &ProxyHost, &reason)
                });
                self.act_now(verdict)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in &self.check.response_headers {
            if let Err(e) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
                log::warn!("adding {name} failed: {e:?}");
            }
        }
        Action::Continue
    }
}
