//! The host calls about the request itself (its headers, properties, the clock, its
//! response's headers) made through the raw ABI rather than the SDK: the SDK's wrappers
//! panic on a status they do not expect, and a panic would kill the VM and every request
//! of its worker. These run on every request, so they also skip the SDK's copies.

use crate::header_map::HeaderMap;
use proxy_wasm::types::{MapType, Status};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_pairs(
        map_type: MapType,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> Status;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> Status;
    fn proxy_add_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> Status;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> Status;
}

/// Milliseconds since the Unix epoch by the host's clock; 0 if the host will not tell.
pub fn now_ms() -> u64 {
    let mut nanos = 0;
    // SAFETY: `nanos` outlives the call.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut nanos) };
    match status {
        Status::Ok => nanos / 1_000_000,
        _ => 0,
    }
}

/// Adds a header to the response on its way back. The SDK's wrapper panics on a status it
/// does not expect (a host that refuses, say, after a local reply).
pub fn add_response_header(name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: the pointers and lengths describe `name` and `value`, alive across the call.
    let status = unsafe {
        proxy_add_header_map_value(
            MapType::HttpResponseHeaders,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    match status {
        Status::Ok => Ok(()),
        status => Err(status),
    }
}

/// A host property, e.g. `["source", "address"]`; `None` for any status but Ok (the SDK's
/// reader panics on a status it does not expect, such as a host's Unimplemented).
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let serialized = path.join("\0");
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: the pointer and length describe `serialized`; `data` and `size` outlive the
    // call. The host allocates the value through the SDK's allocator, as for header maps.
    let status =
        unsafe { proxy_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size) };
    if status != Status::Ok || data.is_null() {
        return None;
    }
    // SAFETY: see `request_headers`: `data` is non-null and holds `size` initialized bytes.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// The current request's headers, all values of each (empty if the host has none to give:
/// the SDK's reader panics on a status it does not expect).
pub fn request_headers() -> HeaderMap {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: the host writes a buffer it allocated through the SDK's allocator (a `Vec`
    // of `size` bytes), which the `Vec` below takes ownership of, as the SDK itself does.
    let status =
        unsafe { proxy_get_header_map_pairs(MapType::HttpRequestHeaders, &mut data, &mut size) };
    if status != Status::Ok || data.is_null() {
        return HeaderMap::default();
    }
    // SAFETY: see above; `data` is non-null and holds `size` initialized bytes.
    HeaderMap::new(unsafe { Vec::from_raw_parts(data, size, size) })
}
