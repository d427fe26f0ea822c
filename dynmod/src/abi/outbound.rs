//! Calls that reach the bridge: HTTP callouts, a configuration's or a request's, and a
//! configuration's streams.

use super::calls::{headers_as, lend};
use super::exports::*;
use super::*;
use std::ffi::c_void;

/// Sends an HTTP callout owned by configuration `config` (on the main thread only: Envoy
/// keeps a configuration's callouts in a map no lock guards); its id, whose answer comes
/// to `on_http_filter_config_http_callout_done`.
pub fn config_callout(
    config: ConfigEnvoyPtr,
    cluster: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u64, i32> {
    // SAFETY: a live configuration pointer, on the main thread.
    unsafe {
        send_callout(
            envoy_dynamic_module_callback_http_filter_config_http_callout,
            config,
            cluster,
            headers,
            body,
            timeout_ms,
        )
    }
}

/// Opens a stream owned by configuration `config` (on the main thread only, as its
/// callouts): sends `headers` and leaves the stream open, with no timeout of Envoy's; its
/// id, whose events come to `on_http_filter_config_http_stream_*`. Envoy may report the
/// stream reset before this returns.
pub fn config_stream(
    config: ConfigEnvoyPtr,
    cluster: &str,
    headers: &[(&str, &[u8])],
) -> Result<u64, i32> {
    let headers = headers_as(headers);
    let mut id = 0;
    // SAFETY: a live configuration pointer, on the main thread; cluster and headers lent
    // for the call, no body.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_config_start_http_stream(
            config,
            &mut id,
            lend(cluster.as_bytes()),
            headers.as_ptr(),
            headers.len(),
            lend(&[]),
            false,
            0,
        )
    };
    started(result, id)
}

/// Sends `data` on stream `id` of `config`; false if the stream is gone.
pub fn config_stream_send(config: ConfigEnvoyPtr, id: u64, data: &[u8]) -> bool {
    // SAFETY: a live configuration pointer, on the main thread; the data lent for the call.
    unsafe {
        envoy_dynamic_module_callback_http_filter_config_stream_send_data(
            config,
            id,
            lend(data),
            false,
        )
    }
}

/// Resets stream `id` of `config` (one already gone is fine).
pub fn config_stream_reset(config: ConfigEnvoyPtr, id: u64) {
    // SAFETY: a live configuration pointer, on the main thread.
    unsafe { envoy_dynamic_module_callback_http_filter_config_reset_http_stream(config, id) }
}

/// Envoy's callout functions, the configuration's and a request's alike.
type CalloutFn = unsafe extern "C" fn(
    *mut c_void,
    *mut u64,
    ModuleBuffer,
    *const ModuleHeader,
    usize,
    ModuleBuffer,
    u64,
) -> i32;

/// # Safety
/// `owner` must be live and of the kind `send` takes, on the thread that may use it.
unsafe fn send_callout(
    send: CalloutFn,
    owner: *mut c_void,
    cluster: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u64, i32> {
    let headers = headers_as(headers);
    let mut id = 0;
    // SAFETY: as the caller promises; cluster, headers and body lent for the call.
    let result = unsafe {
        send(
            owner,
            &mut id,
            lend(cluster.as_bytes()),
            headers.as_ptr(),
            headers.len(),
            lend(body),
            timeout_ms,
        )
    };
    started(result, id)
}

/// Sends an HTTP callout owned by `filter`; its id, whose answer comes to
/// `on_http_filter_http_callout_done`.
pub fn callout(
    filter: FilterEnvoyPtr,
    cluster: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u64, i32> {
    // SAFETY: a live filter pointer, on its worker.
    unsafe {
        send_callout(
            envoy_dynamic_module_callback_http_filter_http_callout,
            filter,
            cluster,
            headers,
            body,
            timeout_ms,
        )
    }
}

/// A callout's or a stream's id once Envoy started it, or why it did not.
fn started(result: i32, id: u64) -> Result<u64, i32> {
    if result == CALLOUT_OK {
        Ok(id)
    } else {
        Err(result)
    }
}
