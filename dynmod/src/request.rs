//! One request as its hooks see it: its worker's root, its stage (the core's `Stage`), and
//! how Envoy is told to go on (continue, wait, answer now) as the dispatcher decides.

use crate::abi::{self, FilterEnvoyPtr};
use crate::config::FilterConfig;
use crate::host::{ModuleHost, ModuleLink};
use crate::root::Root;
use crate::worker::{self, carry_out};
use ratelimit_config::options::FailureMode;
use ratelimit_filter::decision::admission::Verdict;
use ratelimit_filter::host::Proxy;
use ratelimit_filter::worker::dispatch::Dispatcher;
use ratelimit_filter::worker::dispatch::{Go, Verdicts};
use ratelimit_filter::worker::stage::{Stage, Step};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;

/// Envoy's answers to a request's hooks (`FilterHeadersStatus`, `FilterDataStatus`,
/// `FilterTrailersStatus`).
pub const CONTINUE: i32 = 0;
pub const STOP: i32 = 1;
pub const STOP_AND_BUFFER: i32 = 1;
/// Headers whose check is out: Envoy holds their body and trailers back from every filter,
/// this one's included, until the verdict (as proxy-wasm's pause does), applying flow
/// control to a body that keeps coming.
pub const STOP_ALL_AND_WATERMARK: i32 = 4;

/// One request, as its hooks see it.
pub struct Request {
    pub context_id: u32,
    pub root: Root,
    pub stage: Cell<Stage>,
}

impl Request {
    /// A new request of `config` on the worker running `filter`.
    pub fn new(config: Arc<FilterConfig>, filter: FilterEnvoyPtr) -> Request {
        let root = worker::root(&config, filter);
        let context_id = worker::arrive(filter);
        Request {
            context_id,
            root,
            stage: Cell::new(Stage::default()),
        }
    }

    /// Runs one of this request's events on its dispatcher.
    pub fn run<T>(
        &self,
        filter: FilterEnvoyPtr,
        event: impl FnOnce(&mut Dispatcher, u32, &ModuleHost, &mut ModuleLink) -> (T, Verdicts),
    ) -> Option<T> {
        let id = self.context_id;
        worker::run(&self.root, filter, id, |d, host, link| {
            event(d, id, host, link)
        })
    }

    /// Changes the request's stage.
    pub fn stage<T>(&self, change: impl FnOnce(&mut Stage) -> T) -> T {
        let mut stage = self.stage.get();
        let out = change(&mut stage);
        self.stage.set(stage);
        out
    }

    /// What Envoy does with the request's headers, as the dispatcher says it goes on.
    pub fn headers_go_on(&self, filter: FilterEnvoyPtr, go: Option<Go>) -> i32 {
        match go {
            Some(Go::Wait) => {
                worker::keep_waker(&self.root, self.context_id, filter);
                STOP_ALL_AND_WATERMARK
            }
            // Stopped alone, its body still comes to this filter, which holds it until it
            // has ended and the check is done.
            Some(Go::ReadBody) => {
                self.stage(|s| s.headers_seen(Some(&Go::ReadBody)));
                STOP
            }
            go => self.go_on(filter, go),
        }
    }

    /// What Envoy does with the request, as the dispatcher says it goes on, from its body
    /// or trailers (where a request that waits is held as it is).
    fn go_on(&self, filter: FilterEnvoyPtr, go: Option<Go>) -> i32 {
        match go {
            Some(Go::Continue) | Some(Go::ReadBody) | None => CONTINUE,
            Some(Go::Wait) => {
                worker::keep_waker(&self.root, self.context_id, filter);
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

    /// The response has ended: the dispatcher reads its end (a metered response's
    /// settlement leaves with the worker's next exchange).
    pub fn end_response(&self, filter: FilterEnvoyPtr) {
        self.run(filter, |d, id, host, link| {
            d.response_body(id, &[], true, host, link);
            ((), Vec::new())
        });
    }

    /// A body chunk's or the trailers' answer, as the request's stage says (`hold`: the
    /// hook's code for holding it).
    pub fn step(&self, filter: FilterEnvoyPtr, step: Step, hold: i32) -> i32 {
        match step {
            Step::Pass => CONTINUE,
            Step::Hold => hold,
            Step::BodyEnded => self.body_ended(filter),
        }
    }

    /// The body has ended: the dispatcher reads it and starts the check.
    fn body_ended(&self, filter: FilterEnvoyPtr) -> i32 {
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
