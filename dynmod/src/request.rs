//! One request as its hooks see it: its worker's root, where its check stands, and how
//! Envoy is told to go on (continue, wait, answer now) as the dispatcher decides.

use crate::abi::{self, FilterEnvoyPtr};
use crate::callouts;
use crate::config::FilterConfig;
use crate::host::{ModuleHost, ModuleLink};
use crate::root::Root;
use crate::worker::{self, carry_out};
use ratelimit_config::options::FailureMode;
use ratelimit_filter::decision::admission::Verdict;
use ratelimit_filter::host::Proxy;
use ratelimit_filter::worker::dispatch::Dispatcher;
use ratelimit_filter::worker::dispatch::{Go, Verdicts};
use std::cell::Cell;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

/// Envoy's answers to a request's hooks (`FilterHeadersStatus`, `FilterDataStatus`,
/// `FilterTrailersStatus`).
pub const CONTINUE: i32 = 0;
pub const STOP: i32 = 1;
pub const STOP_AND_BUFFER: i32 = 1;

/// One request, as its hooks see it.
pub struct Request {
    pub context_id: u32,
    pub root: Root,
    /// Its check is out: its body and trailers wait with its headers.
    pub waiting: Rc<Cell<bool>>,
    /// Its check waits for its whole body, which Envoy buffers meanwhile.
    pub reading_body: Cell<bool>,
    /// Its response body is metered.
    pub metered: Cell<bool>,
    /// Its response's end waits for the callouts it carries (its settlement's).
    pub holding_end: Cell<bool>,
}

impl Request {
    /// A new request of `config` on the worker running `filter`.
    pub fn new(config: Arc<FilterConfig>, filter: FilterEnvoyPtr) -> Request {
        let root = worker::root(&config, filter);
        let (context_id, waiting) = worker::arrive(filter);
        Request {
            context_id,
            root,
            waiting,
            reading_body: Cell::new(false),
            metered: Cell::new(false),
            holding_end: Cell::new(false),
        }
    }

    /// Runs one of this request's events on its dispatcher.
    pub fn run<T>(
        &self,
        filter: FilterEnvoyPtr,
        event: impl FnOnce(&mut Dispatcher, u32, &ModuleHost, &mut ModuleLink) -> (T, Verdicts),
    ) -> Option<T> {
        let id = self.context_id;
        worker::run(&self.root, filter, id, false, |d, host, link| {
            event(d, id, host, link)
        })
    }

    /// The response has ended: the dispatcher reads its end, and what it sends (the
    /// settlement) this request carries; the response goes on once that is answered, so
    /// that a settlement depends on no request that is gone.
    pub fn end_response(&self, filter: FilterEnvoyPtr) -> bool {
        let id = self.context_id;
        worker::run(&self.root, filter, id, true, |d, host, link| {
            d.response_body(id, &[], true, host, link);
            ((), Vec::new())
        });
        let hold = callouts::carries(id);
        self.holding_end.set(hold);
        !hold
    }

    /// What Envoy does with the request now, as the dispatcher says it goes on.
    pub fn go_on(&self, filter: FilterEnvoyPtr, go: Option<Go>) -> i32 {
        match go {
            Some(Go::Continue) | None => CONTINUE,
            Some(Go::Wait) => {
                self.waiting.set(true);
                worker::keep_waker(&self.root, self.context_id, filter);
                STOP
            }
            // Headers and body are held until the body has ended and the check is done.
            Some(Go::ReadBody) => {
                self.reading_body.set(true);
                STOP
            }
            Some(Go::Answer(verdict)) => match verdict {
                Verdict::Resume => CONTINUE,
                Verdict::Reply(_) => {
                    carry_out(filter, &verdict);
                    STOP
                }
            },
        }
    }

    /// The body has ended: the dispatcher reads it and starts the check.
    pub fn body_ended(&self, filter: FilterEnvoyPtr) -> i32 {
        self.reading_body.set(false);
        let go = self.run(filter, |d, id, host, link| {
            d.request_body(id, &host.request_body());
            d.request_body_end(id, host, link)
        });
        self.go_on(filter, go)
    }

    /// A request hook's answer when it panicked: per the failure mode, it goes on or is
    /// answered 503.
    pub fn failed(&self, filter: FilterEnvoyPtr) -> i32 {
        failed(&self.root.config, filter)
    }
}

pub fn failed(config: &FilterConfig, filter: FilterEnvoyPtr) -> i32 {
    match config.config.failure_mode {
        FailureMode::Open => CONTINUE,
        FailureMode::Closed | FailureMode::Local => {
            abi::send_response(filter, 503, &[], b"rate limiter error\n");
            STOP
        }
    }
}

/// The test build's planted panic (`planted-panic`).
#[cfg(feature = "planted-panic")]
#[allow(clippy::panic)]
pub fn planted_panic(filter: FilterEnvoyPtr) {
    if abi::header(filter, abi::REQUEST_HEADERS, "x-ratelimit-test-panic").is_some() {
        panic!("planted by the test build");
    }
}

/// # Safety
/// `module` must be a pointer `on_http_filter_new` returned and Envoy has not destroyed.
pub unsafe fn request<'a>(module: *const c_void) -> &'a Request {
    // SAFETY: as the caller promises; only shared references are ever made.
    unsafe { &*(module as *const Request) }
}
