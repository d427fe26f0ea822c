//! The hooks of a configuration, on Envoy's main thread, each behind `guard`: made and
//! destroyed, its scheduler's events, its callouts answered; and the hooks Envoy requires
//! that the module has no use for.

use crate::abi::{self, ConfigEnvoyPtr, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};
use crate::config::FilterConfig;
use crate::guard::guard;
use crate::reply::{reply, status};
use crate::streams::{Streams, UNAVAILABLE};
use crate::worker;
use std::ffi::c_void;
use std::ptr::null;
use std::sync::Arc;

/// The filter's name in Envoy's configuration (`filter_name`).
const FILTER_NAME: &[u8] = b"ratelimit";

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
                crate::teardown::made(&config);
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
            crate::teardown::destroyed(config);
        },
    )
}

/// The main thread's turn: a worker left parcels for the courier, the ticker says the
/// roots' tick is due, or a configuration destroyed on a worker waits (`teardown`).
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
            crate::teardown::end_pending();
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
            // SAFETY: arrays Envoy lends for this call, of the sizes it gives.
            let (status, body) =
                unsafe { reply(result, headers, headers_size, chunks, chunks_size) };
            config.courier.answered(callout_id, status, body);
        },
    )
}

/// The events of a worker's stream to the bridge (`streams`), on the main thread.
fn on_stream(config: *const c_void, hook: &str, event: impl FnOnce(&Streams)) {
    guard(
        hook,
        || (),
        || {
            // SAFETY: the live configuration `config_new` made.
            let config = unsafe { &*config.cast::<FilterConfig>() };
            if let Some(streams) = &config.courier.streams {
                event(streams);
            }
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    envoy: ConfigEnvoyPtr,
    config: *const c_void,
    stream_id: u64,
    headers: *const EnvoyHeader,
    headers_size: usize,
    end_stream: bool,
) {
    on_stream(config, "config_http_stream_headers", |streams| {
        // SAFETY: an array Envoy lends for this call, of the size it gives.
        let status = unsafe { status(headers, headers_size) };
        streams.headers(envoy, stream_id, status, end_stream);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    envoy: ConfigEnvoyPtr,
    config: *const c_void,
    stream_id: u64,
    data: *const EnvoyBuffer,
    data_count: usize,
    end_stream: bool,
) {
    on_stream(config, "config_http_stream_data", |streams| {
        let data = match data.is_null() {
            true => &[][..],
            // SAFETY: an array Envoy lends for this call, of the size it gives.
            false => unsafe { std::slice::from_raw_parts(data, data_count) },
        };
        // SAFETY: Envoy's buffers for this hook.
        let chunks: Vec<&[u8]> = data.iter().map(|b| unsafe { abi::borrow(b) }).collect();
        streams.data(envoy, stream_id, &chunks);
        if end_stream {
            streams.closed(stream_id, UNAVAILABLE);
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _envoy: ConfigEnvoyPtr,
    config: *const c_void,
    stream_id: u64,
    _trailers: *const EnvoyHeader,
    _trailers_size: usize,
) {
    on_stream(config, "config_http_stream_trailers", |streams| {
        streams.closed(stream_id, UNAVAILABLE);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _envoy: ConfigEnvoyPtr,
    config: *const c_void,
    stream_id: u64,
) {
    on_stream(config, "config_http_stream_complete", |streams| {
        streams.closed(stream_id, UNAVAILABLE);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _envoy: ConfigEnvoyPtr,
    config: *const c_void,
    stream_id: u64,
    _reason: i32,
) {
    on_stream(config, "config_http_stream_reset", |streams| {
        streams.closed(stream_id, UNAVAILABLE);
    })
}

// Required by Envoy; the module starts no streams of a request's own.

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
