//! A callout's reply as Envoy hands it to a hook: its status and its body, read only up to
//! the longest reply the wire allows (one byte more, so that a longer one is refused).

use crate::abi::{self, EnvoyBuffer, EnvoyHeader};
use ratelimit_filter::wire::MAX_REPLY_LEN;

/// A callout's reply: its HTTP status and its body, bounded; no status and no body for
/// one that failed (`result`: reset, timed out, or never sent).
///
/// # Safety
/// The arrays must hold the sizes given, and be Envoy's for the current hook.
pub unsafe fn reply(
    result: i32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) -> (Option<u32>, Vec<u8>) {
    if result != abi::CALLOUT_OK {
        return (None, Vec::new());
    }
    // SAFETY: as the caller promises.
    let status = unsafe { status(headers, headers_size) };
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

/// The `:status` of a response's headers.
///
/// # Safety
/// The array must hold the size given, and be Envoy's for the current hook.
pub unsafe fn status(headers: *const EnvoyHeader, headers_size: usize) -> Option<u32> {
    let headers = match headers.is_null() {
        true => &[][..],
        // SAFETY: as the caller promises.
        false => unsafe { std::slice::from_raw_parts(headers, headers_size) },
    };
    headers
        .iter()
        // SAFETY: Envoy's buffers for this hook.
        .find(|h| unsafe { abi::borrow(&h.key) } == b":status")
        .and_then(|h| {
            std::str::from_utf8(unsafe { abi::borrow(&h.value) })
                .ok()?
                .parse()
                .ok()
        })
}
