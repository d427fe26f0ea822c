//! The part of Envoy's dynamic-module C ABI (`source/extensions/dynamic_modules/abi/abi.h`,
//! ABI v0.2.0 as Envoy 1.40 exports it) that the module uses: its types and the callbacks
//! Envoy exports, declared by hand and reviewed against the header, and thin calls over them
//! that turn every host answer into a value, never a panic. Envoy loads modules with
//! `RTLD_NOW`, so a callback declared here that the binary does not export stops the module
//! from loading at all rather than later.

use std::ffi::c_void;

pub type ConfigEnvoyPtr = *mut c_void;
pub type FilterEnvoyPtr = *mut c_void;

/// Bytes Envoy owns, valid for the current hook.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// Bytes the module owns, lent for the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

#[repr(C)]
pub struct ModuleHeader {
    pub key: ModuleBuffer,
    pub value: ModuleBuffer,
}

#[repr(C)]
pub struct EnvoyHeader {
    pub key: EnvoyBuffer,
    pub value: EnvoyBuffer,
}

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADERS: i32 = 0;
pub const RESPONSE_HEADERS: i32 = 2;
/// `envoy_dynamic_module_type_http_body_type`.
pub const RECEIVED_REQUEST_BODY: i32 = 0;
pub const BUFFERED_REQUEST_BODY: i32 = 1;
pub const RECEIVED_RESPONSE_BODY: i32 = 2;
/// `envoy_dynamic_module_type_attribute_id`.
pub const SOURCE_ADDRESS: i32 = 24;
pub const XDS_ROUTE_NAME: i32 = 61;
/// `envoy_dynamic_module_type_http_callout_init_result_Success`, and `_result_Success`.
pub const CALLOUT_OK: i32 = 0;
/// `envoy_dynamic_module_type_metrics_result_Success`.
pub const METRICS_OK: i32 = 0;
/// `envoy_dynamic_module_type_log_level`.
pub const LOG_DEBUG: i32 = 1;
pub const LOG_INFO: i32 = 2;
pub const LOG_WARN: i32 = 3;
pub const LOG_ERROR: i32 = 4;

extern "C" {
    fn envoy_dynamic_module_callback_log(level: i32, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigEnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: i32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: i32,
        result: *mut EnvoyHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: i32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: i32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: i32,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: i32,
        number_of_bytes: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute_id: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);
    fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: FilterEnvoyPtr);
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: ConfigEnvoyPtr,
    ) -> SchedulerPtr;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: SchedulerPtr);
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: ConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> i32;
}

/// A configuration's scheduler: an event committed from any thread runs on Envoy's main
/// thread (`on_http_filter_config_scheduled`).
pub type SchedulerPtr = *mut c_void;

pub fn config_scheduler(config: ConfigEnvoyPtr) -> SchedulerPtr {
    // SAFETY: a live configuration pointer, on the main thread (in `config_new`).
    unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_new(config) }
}

pub fn commit(scheduler: SchedulerPtr, event_id: u64) {
    // SAFETY: a live scheduler; Envoy makes committing safe from any thread.
    unsafe {
        envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler, event_id)
    }
}

pub fn delete_scheduler(scheduler: SchedulerPtr) {
    // SAFETY: a scheduler `config_scheduler` made, deleted once.
    unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler) }
}

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
    let headers = headers_as(headers);
    let mut id = 0;
    // SAFETY: a live configuration pointer; cluster, headers and body lent for the call.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_config_http_callout(
            config,
            &mut id,
            lend(cluster.as_bytes()),
            headers.as_ptr(),
            headers.len(),
            lend(body),
            timeout_ms,
        )
    };
    if result == CALLOUT_OK {
        Ok(id)
    } else {
        Err(result)
    }
}

fn lend(bytes: &[u8]) -> ModuleBuffer {
    ModuleBuffer {
        ptr: bytes.as_ptr(),
        length: bytes.len(),
    }
}

/// # Safety
/// `buffer` must be one Envoy handed over for the current hook.
pub unsafe fn borrow<'a>(buffer: &EnvoyBuffer) -> &'a [u8] {
    if buffer.ptr.is_null() || buffer.length == 0 {
        return &[];
    }
    // SAFETY: Envoy keeps the bytes valid for the hook, as the caller promises.
    unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.length) }
}

fn headers_as(pairs: &[(&str, &[u8])]) -> Vec<ModuleHeader> {
    pairs
        .iter()
        .map(|(k, v)| ModuleHeader {
            key: lend(k.as_bytes()),
            value: lend(v),
        })
        .collect()
}

pub fn log(level: i32, message: &str) {
    // SAFETY: a module buffer lent for the call.
    unsafe { envoy_dynamic_module_callback_log(level, lend(message.as_bytes())) }
}

/// Defines counter `name` (only while the configuration is being made); its id.
pub fn define_counter(config: ConfigEnvoyPtr, name: &str) -> Option<usize> {
    let mut id = 0;
    // SAFETY: a live configuration pointer, a lent name, no labels, an out pointer.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_config_define_counter(
            config,
            lend(name.as_bytes()),
            std::ptr::null(),
            0,
            &mut id,
        )
    };
    (result == METRICS_OK).then_some(id)
}

pub fn increment_counter(config: ConfigEnvoyPtr, id: usize, n: u64) {
    // SAFETY: a live configuration pointer and a counter id it defined, no labels.
    unsafe {
        envoy_dynamic_module_callback_http_filter_config_increment_counter(
            config,
            id,
            std::ptr::null(),
            0,
            n,
        );
    }
}

/// Every header of `header_type`, as (name, value) copies.
pub fn headers(filter: FilterEnvoyPtr, header_type: i32) -> Vec<(Vec<u8>, Vec<u8>)> {
    // SAFETY: a live filter pointer during its hook; the vector holds `size` entries.
    unsafe {
        let size = envoy_dynamic_module_callback_http_get_headers_size(filter, header_type);
        let mut out: Vec<EnvoyHeader> = Vec::with_capacity(size);
        let empty = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        out.resize_with(size, || EnvoyHeader {
            key: empty,
            value: empty,
        });
        if size == 0
            || !envoy_dynamic_module_callback_http_get_headers(
                filter,
                header_type,
                out.as_mut_ptr(),
            )
        {
            return Vec::new();
        }
        out.iter()
            .map(|h| (borrow(&h.key).to_vec(), borrow(&h.value).to_vec()))
            .collect()
    }
}

/// The first value of header `name` of `header_type`.
pub fn header(filter: FilterEnvoyPtr, header_type: i32, name: &str) -> Option<Vec<u8>> {
    let mut value = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    // SAFETY: a live filter pointer during its hook, a lent key, out pointers.
    let found = unsafe {
        envoy_dynamic_module_callback_http_get_header(
            filter,
            header_type,
            lend(name.as_bytes()),
            &mut value,
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: the buffer Envoy just filled.
    found.then(|| unsafe { borrow(&value) }.to_vec())
}

pub fn add_header(filter: FilterEnvoyPtr, header_type: i32, name: &str, value: &[u8]) -> bool {
    // SAFETY: a live filter pointer during its hook, lent key and value.
    unsafe {
        envoy_dynamic_module_callback_http_add_header(
            filter,
            header_type,
            lend(name.as_bytes()),
            lend(value),
        )
    }
}

/// Replaces every value of `name` with `value`; `None` removes the header.
pub fn set_header(
    filter: FilterEnvoyPtr,
    header_type: i32,
    name: &str,
    value: Option<&[u8]>,
) -> bool {
    let value = value.map_or(
        ModuleBuffer {
            ptr: std::ptr::null(),
            length: 0,
        },
        lend,
    );
    // SAFETY: a live filter pointer during its hook, lent key and value.
    unsafe {
        envoy_dynamic_module_callback_http_set_header(
            filter,
            header_type,
            lend(name.as_bytes()),
            value,
        )
    }
}

pub fn send_response(filter: FilterEnvoyPtr, status: u32, headers: &[(&str, &[u8])], body: &[u8]) {
    let headers = headers_as(headers);
    // SAFETY: a live filter pointer; headers and body lent for the call.
    unsafe {
        envoy_dynamic_module_callback_http_send_response(
            filter,
            status,
            headers.as_ptr(),
            headers.len(),
            lend(body),
            lend(b"ratelimit"),
        )
    }
}

/// Each chunk of body `body_type`, in order.
pub fn each_body_chunk(filter: FilterEnvoyPtr, body_type: i32, mut each: impl FnMut(&[u8])) {
    // SAFETY: a live filter pointer during its hook; the vector holds `count` entries.
    unsafe {
        let count = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type);
        if count == 0 {
            return;
        }
        let mut chunks = vec![
            EnvoyBuffer {
                ptr: std::ptr::null(),
                length: 0
            };
            count
        ];
        if envoy_dynamic_module_callback_http_get_body_chunks(
            filter,
            body_type,
            chunks.as_mut_ptr(),
        ) {
            chunks.iter().for_each(|c| each(borrow(c)));
        }
    }
}

/// Replaces body `body_type` whole with `body`.
pub fn replace_body(filter: FilterEnvoyPtr, body_type: i32, body: &[u8]) -> bool {
    // SAFETY: a live filter pointer during its hook; the body lent for the call.
    unsafe {
        let size = envoy_dynamic_module_callback_http_get_body_size(filter, body_type);
        envoy_dynamic_module_callback_http_drain_body(filter, body_type, size)
            && envoy_dynamic_module_callback_http_append_body(filter, body_type, lend(body))
    }
}

pub fn attribute(filter: FilterEnvoyPtr, attribute_id: i32) -> Option<Vec<u8>> {
    let mut value = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    // SAFETY: a live filter pointer during its hook, an out pointer.
    let found = unsafe {
        envoy_dynamic_module_callback_http_filter_get_attribute_string(
            filter,
            attribute_id,
            &mut value,
        )
    };
    // SAFETY: the buffer Envoy just filled.
    found.then(|| unsafe { borrow(&value) }.to_vec())
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
    let headers = headers_as(headers);
    let mut id = 0;
    // SAFETY: a live filter pointer; cluster, headers and body lent for the call.
    let result = unsafe {
        envoy_dynamic_module_callback_http_filter_http_callout(
            filter,
            &mut id,
            lend(cluster.as_bytes()),
            headers.as_ptr(),
            headers.len(),
            lend(body),
            timeout_ms,
        )
    };
    if result == CALLOUT_OK {
        Ok(id)
    } else {
        Err(result)
    }
}

pub fn continue_encoding(filter: FilterEnvoyPtr) {
    // SAFETY: a live filter pointer, on its worker.
    unsafe { envoy_dynamic_module_callback_http_filter_continue_encoding(filter) }
}

pub fn continue_decoding(filter: FilterEnvoyPtr) {
    // SAFETY: a live filter pointer, on its worker.
    unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(filter) }
}
