//! The proxy as the filter's logic sees it (`ProxyHost`: the request, the clock, shared
//! data), and what a reply to a callout or a message on the stream reads as, bounded.
//! Every host error is handled here.

use super::abi;
use crate::host::header_map::HeaderMap;
use crate::host::{Kept, Proxy, RequestView, SharedData, Sole};
use crate::wire;
use proxy_wasm::types::{BufferType, MapType};
use ratelimit_protocol::MAX_ID_LINE;
use std::cell::OnceCell;

/// The current (effective) context's request, the clock and shared data.
#[derive(Default)]
pub struct ProxyHost {
    /// The request's headers, fetched in one host call the first time one is read.
    headers: OnceCell<HeaderMap>,
}

impl ProxyHost {
    fn headers(&self) -> &HeaderMap {
        self.headers.get_or_init(abi::request_headers)
    }
}

impl RequestView for ProxyHost {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers().values(name).next()
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        Sole::of(self.headers().values(name))
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.headers().values(name).collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        abi::property(&["source", "address"])
    }

    /// `xds.route_name` in stock Envoy (1.40 has no `route_name`); `route_name`, what
    /// Higress's plugins read, where a host lacks the former. One host call on Envoy.
    fn route_name(&self) -> Option<Vec<u8>> {
        abi::property(&["xds", "route_name"]).or_else(|| abi::property(&["route_name"]))
    }
}

impl SharedData for ProxyHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        abi::shared_data(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        abi::set_shared_data(key, value, cas).is_ok()
    }
}

impl Proxy for ProxyHost {
    fn now_ms(&self) -> u64 {
        abi::now_ms()
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        if let Err(status) = abi::replace_request_header(name, value) {
            log::warn!("could not set request header {name} ({status:?})");
        }
    }

    fn remove_request_header(&self, name: &str) {
        if let Err(status) = abi::remove_request_header(name) {
            log::warn!("could not remove request header {name} ({status:?})");
        }
    }

    fn request_body(&self) -> Vec<u8> {
        let mut body = Vec::new();
        abi::each_slice(BufferType::HttpRequestBody, |slice| {
            body.extend_from_slice(slice)
        });
        body
    }

    fn replace_request_body(&self, held: usize, body: &[u8]) {
        if let Err(status) = abi::replace_buffer(BufferType::HttpRequestBody, held, body) {
            log::warn!("could not replace the request body ({status:?})");
        }
    }

    fn keep(&self) -> Kept {
        Kept::new(
            self.headers().clone(),
            self.source_address(),
            self.route_name(),
        )
    }
}

/// The reply to the callout being answered: HTTP status (`None` for a reset or a timeout
/// without one) and body, bounded.
pub fn callout_reply(num_headers: usize, body_size: usize) -> (Option<u32>, Vec<u8>) {
    // A reset callout comes back with no headers, and then Envoy has no reply map at
    // all: reading it answers BadArgument, on which the SDK panics. Don't ask.
    let status = (num_headers > 0)
        .then(|| abi::header_value(MapType::HttpCallResponseHeaders, ":status"))
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok());
    let size = body_size.min(wire::MAX_REPLY_LEN + 1);
    let body = (size > 0)
        .then(|| abi::buffer(BufferType::HttpCallResponseBody, size))
        .flatten()
        .unwrap_or_default();
    (status, body)
}

/// The stream message being delivered, bounded: anything longer is garbage anyway.
pub fn stream_message(size: usize) -> Vec<u8> {
    let size = size.min(MAX_ID_LINE + wire::MAX_REPLY_LEN + 1);
    abi::buffer(BufferType::GrpcReceiveBuffer, size).unwrap_or_default()
}
