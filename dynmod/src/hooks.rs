//! The event hooks Envoy calls, each behind `guard`: a configuration made and destroyed, and
//! a request's life (headers, body, trailers, its check's callout answered, the response's
//! headers, body and trailers, its end). A request's hooks hand its events to its worker's
//! dispatcher (`worker::run`) and answer Envoy as the dispatcher decides: go on, wait,
//! answer now. Hooks Envoy requires but the module has no use for answer nothing.

use crate::abi::{self, ConfigEnvoyPtr, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};
use crate::callouts;
use crate::config::FilterConfig;
use crate::guard::guard;
use crate::host::{ModuleHost, ModuleLink};
use crate::lane::Lane;
use crate::worker::{self, carry_out};
use ratelimit_config::options::FailureMode;
use ratelimit_filter::decision::admission::Verdict;
use ratelimit_filter::host::Proxy;
use ratelimit_filter::wire::MAX_REPLY_LEN;
use ratelimit_filter::worker::dispatch::Dispatcher;
use ratelimit_filter::worker::dispatch::{Go, Verdicts};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr::null;
use std::rc::Rc;
use std::sync::Arc;

/// The filter's name in Envoy's configuration (`filter_name`).
const FILTER_NAME: &[u8] = b"ratelimit";

/// Envoy's answers to a request's hooks (`FilterHeadersStatus`, `FilterDataStatus`,
/// `FilterTrailersStatus`).
const CONTINUE: i32 = 0;
const STOP: i32 = 1;
const STOP_AND_BUFFER: i32 = 1;

/// One request, as its hooks see it.
struct Request {
    context_id: u32,
    lane: Lane,
    /// Its check is out: its body and trailers wait with its headers.
    waiting: Rc<Cell<bool>>,
    /// Its check waits for its whole body, which Envoy buffers meanwhile.
    reading_body: Cell<bool>,
    /// Its response body is metered.
    metered: Cell<bool>,
    /// Its response's end waits for the callouts it carries (its settlement's).
    holding_end: Cell<bool>,
}

impl Request {
    /// Runs one of this request's events on its dispatcher.
    fn run<T>(
        &self,
        filter: FilterEnvoyPtr,
        event: impl FnOnce(&mut Dispatcher, u32, &ModuleHost, &mut ModuleLink) -> (T, Verdicts),
    ) -> Option<T> {
        let id = self.context_id;
        worker::run(&self.lane, filter, id, false, |d, host, link| {
            event(d, id, host, link)
        })
    }

    /// The response has ended: the dispatcher reads its end, and what it sends (the
    /// settlement) this request carries; the response goes on once that is answered, so
    /// that a settlement depends on no request that is gone.
    fn end_response(&self, filter: FilterEnvoyPtr) -> bool {
        let id = self.context_id;
        worker::run(&self.lane, filter, id, true, |d, host, link| {
            d.response_body(id, &[], true, host, link);
            ((), Vec::new())
        });
        let hold = callouts::carries(id);
        self.holding_end.set(hold);
        !hold
    }

    /// What Envoy does with the request now, as the dispatcher says it goes on.
    fn go_on(&self, filter: FilterEnvoyPtr, go: Option<Go>) -> i32 {
        match go {
            Some(Go::Continue) | None => CONTINUE,
            Some(Go::Wait) => {
                self.waiting.set(true);
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
    fn body_ended(&self, filter: FilterEnvoyPtr) -> i32 {
        self.reading_body.set(false);
        let go = self.run(filter, |d, id, host, link| {
            d.request_body(id, &host.request_body());
            d.request_body_end(id, host, link)
        });
        self.go_on(filter, go)
    }

    /// A request hook's answer when it panicked: per the failure mode, it goes on or is
    /// answered 503.
    fn failed(&self, filter: FilterEnvoyPtr) -> i32 {
        failed(&self.lane.config, filter)
    }
}

fn failed(config: &FilterConfig, filter: FilterEnvoyPtr) -> i32 {
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
fn planted_panic(filter: FilterEnvoyPtr) {
    if abi::header(filter, abi::REQUEST_HEADERS, "x-ratelimit-test-panic").is_some() {
        panic!("planted by the test build");
    }
}

/// # Safety
/// `module` must be a pointer `on_http_filter_new` returned and Envoy has not destroyed.
unsafe fn request<'a>(module: *const c_void) -> &'a Request {
    // SAFETY: as the caller promises; only shared references are ever made.
    unsafe { &*(module as *const Request) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guard("config_new", null, || {
        // SAFETY: buffers Envoy lends for this call.
        let (name, json) = unsafe { (abi::borrow(&name), abi::borrow(&config)) };
        if name != FILTER_NAME {
            log::error!(
                "filter_name {:?}: this module's filter is \"ratelimit\"",
                String::from_utf8_lossy(name)
            );
            return null();
        }
        match FilterConfig::new(envoy, json) {
            Some(config) => {
                let config = Arc::new(config);
                crate::config::start_ticker(&config);
                Arc::into_raw(config).cast()
            }
            None => null(),
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guard(
        "config_destroy",
        || (),
        || {
            // SAFETY: the pointer `config_new` made from an Arc, destroyed once.
            let config = unsafe { Arc::from_raw(config.cast::<FilterConfig>()) };
            config.retire();
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    filter: FilterEnvoyPtr,
) -> *const c_void {
    guard("filter_new", null, || {
        let config = config.cast::<FilterConfig>();
        // SAFETY: the live pointer `config_new` made from an Arc: one more owner for the
        // request.
        let config = unsafe {
            Arc::increment_strong_count(config);
            Arc::from_raw(config)
        };
        let lane = worker::lane(&config, filter);
        let (context_id, waiting) = worker::arrive(filter);
        let request = Request {
            context_id,
            lane,
            waiting,
            reading_body: Cell::new(false),
            metered: Cell::new(false),
            holding_end: Cell::new(false),
        };
        Box::into_raw(Box::new(request)).cast_const().cast()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "request_headers",
        || request.failed(filter),
        || {
            #[cfg(feature = "planted-panic")]
            planted_panic(filter);
            let go = request.run(filter, |d, id, host, link| {
                d.request_headers(id, end_of_stream, host, link)
            });
            request.go_on(filter, go)
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "request_body",
        || request.failed(filter),
        || {
            match (request.reading_body.get(), end_of_stream) {
                (true, true) => request.body_ended(filter),
                (true, false) => STOP_AND_BUFFER,
                // Held with its headers until the check lets the request go.
                (false, _) if request.waiting.get() => STOP_AND_BUFFER,
                (false, _) => CONTINUE,
            }
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "request_trailers",
        || request.failed(filter),
        || {
            if request.reading_body.get() {
                request.body_ended(filter)
            } else if request.waiting.get() {
                STOP
            } else {
                CONTINUE
            }
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    callout_id: u64,
    result: i32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "http_callout_done",
        || {
            request.failed(filter);
        },
        || {
            let (status, body) = if result == abi::CALLOUT_OK {
                // SAFETY: arrays Envoy lends for this call, of the sizes it gives.
                unsafe { reply(headers, headers_size, chunks, chunks_size) }
            } else {
                (None, Vec::new())
            };
            let token = callouts::answered(request.context_id, callout_id);
            request.run(filter, |d, id, host, link| {
                // Its own check, or a batch the dispatcher sent while this request's hook ran.
                let mut verdicts = d.own_callout_reply(id, status, &body, host, link);
                if let Some(token) = token {
                    verdicts.extend(d.callout_reply(token, status, &body, host, link));
                }
                ((), verdicts)
            });
            if request.holding_end.get() && !callouts::carries(request.context_id) {
                request.holding_end.set(false);
                abi::continue_encoding(filter);
            }
        },
    )
}

/// A callout's answer: its HTTP status and its body, bounded.
///
/// # Safety
/// The arrays must hold the sizes given, and be Envoy's for the current hook.
unsafe fn reply(
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) -> (Option<u32>, Vec<u8>) {
    let headers = match headers.is_null() {
        true => &[][..],
        // SAFETY: as the caller promises.
        false => unsafe { std::slice::from_raw_parts(headers, headers_size) },
    };
    let status = headers
        .iter()
        // SAFETY: Envoy's buffers for this hook.
        .find(|h| unsafe { abi::borrow(&h.key) } == b":status")
        .and_then(|h| {
            std::str::from_utf8(unsafe { abi::borrow(&h.value) })
                .ok()?
                .parse()
                .ok()
        });
    let chunks = match chunks.is_null() {
        true => &[][..],
        // SAFETY: as the caller promises.
        false => unsafe { std::slice::from_raw_parts(chunks, chunks_size) },
    };
    let mut body = Vec::new();
    for chunk in chunks {
        // SAFETY: Envoy's buffers for this hook.
        let chunk = unsafe { abi::borrow(chunk) };
        let room = (MAX_REPLY_LEN + 1).saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    (status, body)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "response_headers",
        || CONTINUE,
        || {
            let header = |name: &str| abi::header(filter, abi::RESPONSE_HEADERS, name);
            let start = request
                .run(filter, |d, id, host, link| {
                    (d.response_headers(id, header, host, link), Vec::new())
                })
                .unwrap_or_default();
            request.metered.set(start.read_body);
            request.reading_body.set(false);
            if let Some(reply) = start.refused {
                carry_out(filter, &Verdict::Reply(reply));
                return STOP;
            }
            if let Some(fields) = start.fields {
                fields.each(|name, value| {
                    if !abi::add_header(filter, abi::RESPONSE_HEADERS, name, value) {
                        log::warn!("adding {name} failed");
                    }
                });
            }
            CONTINUE
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "response_body",
        || CONTINUE,
        || {
            if request.metered.get() {
                request.metered.set(!end_of_stream);
                let mut chunks = Vec::new();
                abi::each_body_chunk(filter, abi::RECEIVED_RESPONSE_BODY, |c| {
                    chunks.push(c.to_vec())
                });
                request.run(filter, |d, id, host, link| {
                    for chunk in &chunks {
                        d.response_body(id, chunk, false, host, link);
                    }
                    ((), Vec::new())
                });
                if end_of_stream && !request.end_response(filter) {
                    return STOP_AND_BUFFER;
                }
            }
            CONTINUE
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> i32 {
    // SAFETY: Envoy's live filter.
    let request = unsafe { request(module) };
    guard(
        "response_trailers",
        || CONTINUE,
        || {
            if request.metered.replace(false) && !request.end_response(filter) {
                return STOP;
            }
            CONTINUE
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _: FilterEnvoyPtr,
    _: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guard(
        "filter_destroy",
        || (),
        || {
            // SAFETY: the pointer `filter_new` made from a Box, destroyed once.
            let request = unsafe { Box::from_raw(module.cast_mut().cast::<Request>()) };
            // The batches its callouts carried failed with it: the dispatcher gives their
            // members' work back (a settlement is retried).
            for parcel in worker::leave(request.context_id) {
                request.lane.config.courier.post(parcel);
            }
            request.run(std::ptr::null_mut(), |d, id, host, link| {
                d.request_gone(id, host, link);
                ((), Vec::new())
            });
        },
    )
}

/// The main thread's turn: a worker left parcels for the courier, or the ticker says the
/// lanes' tick is due.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    envoy: ConfigEnvoyPtr,
    config: *const c_void,
    event_id: u64,
) {
    guard(
        "config_scheduled",
        || (),
        || {
            // SAFETY: the live configuration `config_new` made.
            let config = unsafe { &*config.cast::<FilterConfig>() };
            if event_id == crate::courier::TICK {
                worker::tick_all(config);
            }
            config.courier.send(envoy);
        },
    )
}

/// A courier's callout was answered, on the main thread.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _envoy: ConfigEnvoyPtr,
    config: *const c_void,
    callout_id: u64,
    result: i32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    guard(
        "config_http_callout_done",
        || (),
        || {
            // SAFETY: the live configuration `config_new` made.
            let config = unsafe { &*config.cast::<FilterConfig>() };
            let (status, body) = if result == abi::CALLOUT_OK {
                // SAFETY: arrays Envoy lends for this call, of the sizes it gives.
                unsafe { reply(headers, headers_size, chunks, chunks_size) }
            } else {
                (None, Vec::new())
            };
            config.courier.answered(callout_id, status, body);
        },
    )
}

// Required by Envoy; the module starts no streams and schedules nothing per request.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
    _: *const EnvoyHeader,
    _: usize,
    _: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
    _: *const EnvoyBuffer,
    _: usize,
    _: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
    _: *const EnvoyHeader,
    _: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
    _: i32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _: FilterEnvoyPtr,
    _: *const c_void,
    _: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _: FilterEnvoyPtr,
    _: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _: FilterEnvoyPtr,
    _: *const c_void,
) {
}
