//! The fake's request callbacks: headers, bodies, local replies, a request's own callouts,
//! resuming it, and its schedulers. A call on a request Envoy has destroyed, or on a
//! pointer it never handed out, is recorded as a misuse, which every test checks is none.

use super::{bytes, envoy, lent, misused, pairs, text, Filter};
use crate::abi::{
    EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr, FilterSchedulerPtr, ModuleBuffer, ModuleHeader,
    BUFFERED_REQUEST_BODY, CALLOUT_OK, RECEIVED_REQUEST_BODY, RECEIVED_RESPONSE_BODY,
    REQUEST_HEADERS,
};

/// Runs `call` on a live request's state, or records the misuse.
fn on_filter<T: Default>(
    filter: FilterEnvoyPtr,
    what: &str,
    call: impl FnOnce(&mut Filter) -> T,
) -> T {
    let mut envoy = envoy();
    if let Some(f) = envoy
        .filters
        .get_mut(&(filter as usize))
        .filter(|f| !f.destroyed)
    {
        return call(f);
    }
    drop(envoy);
    misused(
        filter as usize,
        format!("{what} on request {filter:?}, gone or never made"),
    );
    T::default()
}

fn headers_of(filter: &mut Filter, kind: i32) -> &mut Vec<(String, Vec<u8>)> {
    match kind {
        REQUEST_HEADERS => &mut filter.request_headers,
        _ => &mut filter.response_headers,
    }
}

fn body_of(filter: &mut Filter, kind: i32) -> &mut Vec<Vec<u8>> {
    match kind {
        RECEIVED_REQUEST_BODY => &mut filter.received,
        BUFFERED_REQUEST_BODY => &mut filter.buffered,
        RECEIVED_RESPONSE_BODY => &mut filter.response_body,
        _ => &mut filter.other_body,
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(
    filter: FilterEnvoyPtr,
    kind: i32,
) -> usize {
    on_filter(filter, "get_headers_size", |f| headers_of(f, kind).len())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    filter: FilterEnvoyPtr,
    kind: i32,
    result: *mut EnvoyHeader,
) -> bool {
    on_filter(filter, "get_headers", |f| {
        for (i, (key, value)) in headers_of(f, kind).iter().enumerate() {
            let header = EnvoyHeader {
                key: lent(key.as_bytes()),
                value: lent(value),
            };
            // SAFETY: the module's array holds as many as `get_headers_size` said.
            unsafe { result.add(i).write(header) };
        }
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_header(
    filter: FilterEnvoyPtr,
    kind: i32,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
    index: usize,
    optional_size: *mut usize,
) -> bool {
    let key = text(&key);
    on_filter(filter, "get_header", |f| {
        let values: Vec<&Vec<u8>> = headers_of(f, kind)
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(&key))
            .map(|(_, v)| v)
            .collect();
        if !optional_size.is_null() {
            // SAFETY: the module's out pointer.
            unsafe { *optional_size = values.len() };
        }
        let Some(value) = values.get(index) else {
            return false;
        };
        // SAFETY: the module's out pointer.
        unsafe { *result = lent(value) };
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_add_header(
    filter: FilterEnvoyPtr,
    kind: i32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    on_filter(filter, "add_header", |f| {
        headers_of(f, kind).push((text(&key), bytes(&value)));
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_set_header(
    filter: FilterEnvoyPtr,
    kind: i32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let (key, remove) = (text(&key), value.ptr.is_null());
    on_filter(filter, "set_header", |f| {
        let headers = headers_of(f, kind);
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
        if !remove {
            headers.push((key, bytes(&value)));
        }
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_send_response(
    filter: FilterEnvoyPtr,
    status: u32,
    headers: *const ModuleHeader,
    headers_size: usize,
    body: ModuleBuffer,
    _details: ModuleBuffer,
) {
    let (headers, body) = (pairs(headers, headers_size), bytes(&body));
    on_filter(filter, "send_response", |f| {
        f.answered.push((status, headers, body));
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(
    filter: FilterEnvoyPtr,
    kind: i32,
) -> usize {
    on_filter(filter, "get_body_chunks_size", |f| body_of(f, kind).len())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    filter: FilterEnvoyPtr,
    kind: i32,
    result: *mut EnvoyBuffer,
) -> bool {
    on_filter(filter, "get_body_chunks", |f| {
        for (i, chunk) in body_of(f, kind).iter().enumerate() {
            // SAFETY: the module's array holds as many as `get_body_chunks_size` said.
            unsafe { result.add(i).write(lent(chunk)) };
        }
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_size(
    filter: FilterEnvoyPtr,
    kind: i32,
) -> usize {
    on_filter(filter, "get_body_size", |f| {
        body_of(f, kind).iter().map(Vec::len).sum()
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_append_body(
    filter: FilterEnvoyPtr,
    kind: i32,
    data: ModuleBuffer,
) -> bool {
    on_filter(filter, "append_body", |f| {
        body_of(f, kind).push(bytes(&data));
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_drain_body(
    filter: FilterEnvoyPtr,
    kind: i32,
    _bytes: usize,
) -> bool {
    on_filter(filter, "drain_body", |f| {
        body_of(f, kind).clear();
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    filter: FilterEnvoyPtr,
    _attribute: i32,
    _result: *mut EnvoyBuffer,
) -> bool {
    on_filter(filter, "get_attribute_string", |_| false)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_http_callout(
    filter: FilterEnvoyPtr,
    callout_id_out: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *const ModuleHeader,
    _headers_size: usize,
    body: ModuleBuffer,
    _timeout_ms: u64,
) -> i32 {
    let body = bytes(&body);
    on_filter(filter, "http_callout", |f| {
        f.callouts.push(body);
        // SAFETY: the module's out pointer.
        unsafe { *callout_id_out = f.callouts.len() as u64 };
        CALLOUT_OK
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr) {
    on_filter(filter, "continue_decoding", |f| f.continued += 1);
}

/// A request's scheduler is its filter pointer: an event for a request that is gone is
/// dropped, as Envoy drops it.
#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(
    filter: FilterEnvoyPtr,
) -> FilterSchedulerPtr {
    on_filter(filter, "scheduler_new", |f| f.schedulers += 1);
    filter
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
    scheduler: FilterSchedulerPtr,
    event_id: u64,
) {
    let mut envoy = envoy();
    let config = envoy.filters.get(&(scheduler as usize)).map(|f| f.config);
    if let Some(config) = config.and_then(|c| envoy.configs.get_mut(&c)) {
        config.worker_events.push((scheduler as usize, event_id));
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
    scheduler: FilterSchedulerPtr,
) {
    let mut envoy = envoy();
    match envoy.filters.get_mut(&(scheduler as usize)) {
        Some(f) if f.schedulers > 0 => f.schedulers -= 1,
        _ => {
            drop(envoy);
            misused(
                scheduler as usize,
                "a request scheduler deleted twice".into(),
            );
        }
    }
}
