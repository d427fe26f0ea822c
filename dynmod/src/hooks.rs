//! The hooks of a request's life, each behind `guard`: made, its headers, body and
//! trailers, its callouts answered, the response's headers, body and trailers, its end. They
//! hand its events to its worker's dispatcher (`worker::run`) and answer Envoy as the
//! dispatcher decides.

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};
use crate::config::FilterConfig;
use crate::guard::guard;
use crate::reply::reply;
use crate::request::{request, Request, CONTINUE, STOP, STOP_AND_BUFFER};
use crate::worker::{self, carry_out};
use ratelimit_filter::decision::admission::Verdict;
use std::ffi::c_void;
use std::ptr::null;
use std::sync::Arc;

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
        let request = Request::new(config, filter);
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
            crate::request::planted_panic(filter);
            let go = request.run(filter, |d, id, host, link| {
                d.request_headers(id, end_of_stream, host, link)
            });
            request.headers_go_on(filter, go)
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
            let step = request.stage(|s| s.request_body(end_of_stream));
            request.step(filter, step, STOP_AND_BUFFER)
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
            let step = request.stage(|s| s.request_trailers());
            request.step(filter, step, STOP)
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    _callout_id: u64,
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
            // SAFETY: arrays Envoy lends for this call, of the sizes it gives.
            let (status, body) =
                unsafe { reply(result, headers, headers_size, chunks, chunks_size) };
            // A request's only callout is its own check (no group commit).
            request.run(filter, |d, id, host, link| {
                ((), d.own_callout_reply(id, status, &body, host, link))
            });
        },
    )
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
            request.stage(|s| s.response_started(start.read_body));
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
            if request.stage(|s| s.response_body(end_of_stream)) {
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
                if end_of_stream {
                    request.end_response(filter);
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
            if request.stage(|s| s.response_trailers()) {
                request.end_response(filter);
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
            worker::leave(&request.root, request.context_id);
            request.run(std::ptr::null_mut(), |d, id, host, link| {
                d.request_gone(id, host, link);
                ((), Vec::new())
            });
        },
    )
}

/// The worker's turn, brought by a waker (`mailbox`): the answers the courier delivered,
/// and the verdicts they reach, each carried out on its own request.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    _event_id: u64,
) {
    // SAFETY: Envoy's live filter (it drops the event of one that is gone).
    let request = unsafe { request(module) };
    guard(
        "scheduled",
        || (),
        || {
            request.run(filter, |_, _, _, _| ((), Vec::new()));
        },
    )
}
