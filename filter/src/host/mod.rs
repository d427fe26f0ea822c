//! The filter's host boundary: everything its logic asks of the proxy, as three small
//! traits. The proxy-wasm glue implements them over the host's ABI; the unit tests over
//! `fakes`. Nothing here depends on the rest of the crate.
//!
//! A layer of its own, at the bottom, because it is what keeps the rest host-independent:
//! the logic sees the proxy only through these traits, so it compiles and is unit-tested
//! natively. `header_map` is here for the same reason: the form the ABI hands headers
//! over in (a request's, and a local reply's), read in place by plain Rust that the glue
//! only calls.

pub mod header_map;

use header_map::HeaderMap;

/// The request data the filter reads; the proxy-wasm glue implements it over the host.
pub trait RequestView {
    /// A request header by lower-case name (pseudo-headers such as `:path` included); its
    /// first value if it came more than once.
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// A header the request must not repeat (an identity's): read in one pass, since a
    /// repeat can only be told by reading them all.
    fn sole_header(&self, name: &str) -> Sole<'_>;
    /// Every copy of a list header (`X-Forwarded-For`, a method override), in order: a host
    /// may deliver a repeated header as separate copies or join them into one value with
    /// commas (Envoy does for some), and the list must read the same either way.
    fn header_list(&self, name: &str) -> Vec<&[u8]>;
    /// The host's `source.address` property, e.g. `10.0.0.1:5678` or `[::1]:5678`.
    fn source_address(&self) -> Option<Vec<u8>>;
    /// The host's `route_name` property: the name of the route the request took.
    fn route_name(&self) -> Option<Vec<u8>>;
}

/// A request's headers and properties, kept past the event that read them: a host lets a
/// filter read a request's headers only while they are being seen (Envoy forgets them once
/// they go on upstream), and a request held for its body is planned, and reserves, once
/// the body has ended.
#[derive(Debug)]
pub struct Kept {
    headers: HeaderMap,
    source_address: Option<Vec<u8>>,
    route_name: Option<Vec<u8>>,
}

impl Kept {
    pub fn new(
        headers: HeaderMap,
        source_address: Option<Vec<u8>>,
        route_name: Option<Vec<u8>>,
    ) -> Kept {
        Kept {
            headers,
            source_address,
            route_name,
        }
    }
}

impl RequestView for Kept {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.values(name).next()
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        Sole::of(self.headers.values(name))
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.headers.values(name).collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        self.source_address.clone()
    }

    fn route_name(&self) -> Option<Vec<u8>> {
        self.route_name.clone()
    }
}

/// What a request carries of a header that must not repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sole<'a> {
    Absent,
    Once(&'a [u8]),
    /// More than once: which value counts cannot be told.
    Repeated,
}

impl<'a> Sole<'a> {
    /// What the `values` of a header (all of them, in order) come to.
    pub fn of(mut values: impl Iterator<Item = &'a [u8]>) -> Sole<'a> {
        match (values.next(), values.next()) {
            (None, _) => Sole::Absent,
            (Some(value), None) => Sole::Once(value),
            (Some(_), Some(_)) => Sole::Repeated,
        }
    }
}

/// The host's shared key-value store with compare-and-swap (proxy-wasm shared data).
pub trait SharedData {
    /// The value and its version (CAS token), `None` if absent.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Stores `value` if the entry is still at version `cas` (0: unconditionally, as for an
    /// absent entry); `false` on a version mismatch or any host error.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool;
}

/// The proxy the filter runs in, as its logic sees it: the request, a clock and shared data.
pub trait Proxy: RequestView + SharedData {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Sets request header `name` (lower case) to `value` before it goes upstream,
    /// replacing every copy: the one change the filter makes to a request (a metered
    /// rule asks for a response its meter can read). Only while the request's headers are
    /// being seen; a host error is logged and the request goes on as it was.
    fn set_request_header(&self, name: &str, value: &[u8]);
    /// Removes request header `name` before it goes upstream (the same terms).
    fn remove_request_header(&self, name: &str);
    /// The request's body, which the host holds back until the check lets it go (empty
    /// when it holds none).
    fn request_body(&self) -> Vec<u8>;
    /// Replaces the held request body (`held` bytes, all of it) with `body`; a host error
    /// is logged and the body goes on as it was.
    fn replace_request_body(&self, held: usize, body: &[u8]);
    /// The request as it is now, kept for its later events (`Kept`).
    fn keep(&self) -> Kept;
}
