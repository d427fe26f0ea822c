//! Thin calls over Envoy's callbacks: each host answer becomes a value, never a panic.

use super::exports::*;
use super::*;

pub fn filter_scheduler(filter: FilterEnvoyPtr) -> FilterSchedulerPtr {
    // SAFETY: a live filter pointer, on its worker (in one of its hooks).
    unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(filter) }
}

pub fn commit_filter(scheduler: FilterSchedulerPtr, event_id: u64) {
    // SAFETY: a live scheduler; Envoy makes committing safe from any thread, and an event
    // for a request that is gone is dropped.
    unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler, event_id) }
}

pub fn delete_filter_scheduler(scheduler: FilterSchedulerPtr) {
    // SAFETY: a scheduler `filter_scheduler` made, deleted once.
    unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler) }
}

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

pub(super) fn lend(bytes: &[u8]) -> ModuleBuffer {
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

pub(super) fn headers_as(pairs: &[(&str, &[u8])]) -> Vec<ModuleHeader> {
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

/// Every header of `header_type`, lent to `read` as (name, value) pairs of Envoy's own
/// buffers (valid for the hook): no copy of one is made here.
pub fn with_headers<T>(
    filter: FilterEnvoyPtr,
    header_type: i32,
    read: impl FnOnce(&[(&[u8], &[u8])]) -> T,
) -> T {
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
            return read(&[]);
        }
        let pairs: Vec<(&[u8], &[u8])> = out
            .iter()
            .map(|h| (borrow(&h.key), borrow(&h.value)))
            .collect();
        read(&pairs)
    }
}

/// Value `index` of header `name` of `header_type`, and how many values it has if `count`.
fn header_value(
    filter: FilterEnvoyPtr,
    header_type: i32,
    name: &str,
    index: usize,
    count: Option<&mut usize>,
) -> Option<Vec<u8>> {
    let mut value = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    let count = count.map_or(std::ptr::null_mut(), |n| n as *mut usize);
    // SAFETY: a live filter pointer during its hook, a lent key, out pointers.
    let found = unsafe {
        envoy_dynamic_module_callback_http_get_header(
            filter,
            header_type,
            lend(name.as_bytes()),
            &mut value,
            index,
            count,
        )
    };
    // SAFETY: the buffer Envoy just filled.
    found.then(|| unsafe { borrow(&value) }.to_vec())
}

/// The first value of header `name` of `header_type`.
pub fn header(filter: FilterEnvoyPtr, header_type: i32, name: &str) -> Option<Vec<u8>> {
    header_value(filter, header_type, name, 0, None)
}

/// Every value of header `name` of `header_type`, in order (a repeated header's each).
pub fn header_values(filter: FilterEnvoyPtr, header_type: i32, name: &str) -> Vec<Vec<u8>> {
    let mut count = 0;
    let first = header_value(filter, header_type, name, 0, Some(&mut count));
    let mut values = Vec::with_capacity(count);
    values.extend(first.filter(|_| count > 0));
    for index in 1..count {
        values.push(header_value(filter, header_type, name, index, None).unwrap_or_default());
    }
    values
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

pub fn continue_decoding(filter: FilterEnvoyPtr) {
    // SAFETY: a live filter pointer, on its worker.
    unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(filter) }
}
