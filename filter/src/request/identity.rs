//! Who is calling: turns hostile request data into bounded, key-safe identity values.
//!
//! Every value that leaves this module is escaped to a small alphabet (so it can never
//! forge a key separator or a Redis Cluster hash tag) and bounded in length (oversized
//! values are replaced by a digest), before it becomes part of a Redis key: escaped by
//! `ratelimit_config::keys`, as the bridge escapes a value an operator types. An identity
//! a request carries but that cannot be told (repeated, an unreadable JWT) refuses the
//! request: it never exempts it from its rules.

use crate::host::{RequestView, Sole};
use crate::metering::{Text, UsageReader};
use crate::request::jwt::{self, Reading};
use ratelimit_config::keys::{escape, key_safe};
use ratelimit_config::source::{Address, Forwarded, Source};
use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// An identity a request carries but whose value cannot be told. Such a request is refused
/// (`400`), never let through: ignoring the identity would exempt it from every rule keyed
/// on it, and the client chose to send it that way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadIdentity {
    /// Where the value at fault is.
    pub at: Place,
    pub problem: Problem,
}

/// Where an identity's value is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A request header, by name.
    Header(String),
    /// A field of the request's JSON body, by its dotted path.
    Body(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// The header came more than once: which value is the client's cannot be told (a
    /// filter before this one may have appended the real one after a forged one). For a
    /// JWT, a comma counts as a repeat: no token holds one, and a proxy that joins the
    /// copies of a header (Envoy does for `authorization`) separates them with one.
    Repeated,
    /// A JWT header holds a token, or a payload, that cannot be read.
    Unreadable,
    /// A body field holds something other than a string this filter reads (`model: 5`, a
    /// string of more than `MAX_TEXT_LEN` bytes or with a non-ASCII `\u` escape), which the
    /// upstream may still read as some value.
    NotAString,
    /// A body field is in a JSON body that cannot be read whole (malformed, compressed, not
    /// UTF-8), which a lenient upstream may still read a value from.
    BodyUnreadable,
}

/// How a request's body reads as JSON, as far as its identities go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRead {
    /// A JSON object, well formed, no key on a path twice.
    Json,
    /// Not a JSON object at all (empty, a form, binary): it has no fields.
    NotJson,
    /// A key on a path came twice in one object, or in another letter case (Go's reader
    /// takes `Model` for `model`): parsers disagree on which one counts.
    Repeated,
    /// An object that did not read whole (malformed, cut short, not UTF-8), a compressed
    /// body, or one in another encoding: an upstream may still read a value from it
    /// (Python's `json` takes `NaN` and a body after a byte order mark or in UTF-16, Go's
    /// `Decoder` stops at the first value, a decompressor may come after this filter).
    Unreadable,
}

impl BodyRead {
    /// How the body `reader` read (to its end) reads (`plain`: not compressed). A body is
    /// "not JSON" only where no upstream's reader finds a field in it either.
    pub fn of(reader: &UsageReader, plain: bool) -> BodyRead {
        match () {
            _ if reader.bytes() == 0 => BodyRead::NotJson,
            _ if !plain || reader.foreign_encoding() => BodyRead::Unreadable,
            _ if !reader.began_object() => BodyRead::NotJson,
            _ if reader.repeated() => BodyRead::Repeated,
            _ if !reader.well_formed() => BodyRead::Unreadable,
            _ => BodyRead::Json,
        }
    }
}

/// What a request's body holds at a body identity's field, as that identity's value (`read`:
/// how the body reads). Absent when the body is not JSON or lacks the field (or holds
/// `null` or an empty string there), as a header is absent; refused when it may hold a
/// value this filter cannot tell, which would otherwise exempt the request from its rules.
pub fn body_value(text: Text<'_>, read: BodyRead) -> Result<Option<String>, Problem> {
    match (read, text) {
        (BodyRead::NotJson, _) | (BodyRead::Json, Text::Absent) => Ok(None),
        (BodyRead::Repeated, _) => Err(Problem::Repeated),
        (BodyRead::Unreadable, _) => Err(Problem::BodyUnreadable),
        (BodyRead::Json, Text::Unreadable | Text::Bool(_)) => Err(Problem::NotAString),
        (BodyRead::Json, Text::Str(value)) => Ok(key_safe(value).map(Cow::into_owned)),
    }
}

/// Resolves one identity for the current request; `Ok(None)` when the request lacks it.
/// A header value already key-safe is borrowed from the request, not copied.
pub fn resolve<'r>(
    source: &Source,
    req: &'r impl RequestView,
) -> Result<Option<Cow<'r, str>>, BadIdentity> {
    let bad = |name: &String, problem| BadIdentity {
        at: Place::Header(name.clone()),
        problem,
    };
    let single = |name: &String| match req.sole_header(name) {
        Sole::Absent => Ok(None),
        Sole::Once(value) => Ok(Some(value)),
        Sole::Repeated => Err(bad(name, Problem::Repeated)),
    };
    Ok(match source {
        Source::Header(name) => single(name)?.and_then(|v| key_safe(trimmed(v))),
        Source::Jwt {
            header,
            claim,
            unverified,
        } => match single(header)? {
            Some(raw) => jwt_value(trimmed(raw), claim, *unverified)
                .map_err(|problem| bad(header, problem))?
                .map(Cow::Owned),
            None => None,
        },
        Source::Address(address) => client_address(req, address).map(Cow::Owned),
        // Read from the body by the caller (`body_value`), never from the headers.
        Source::Body(_) => None,
    })
}

/// The claim of the JWT in `raw` (trimmed) as a key value: `None` when the header is empty,
/// holds no token or a token without the claim; a payload too long to decode is keyed on
/// its digest.
fn jwt_value(raw: &[u8], claim: &str, unverified: bool) -> Result<Option<String>, Problem> {
    if raw.is_empty() {
        return Ok(None);
    }
    if raw.contains(&b',') {
        return Err(Problem::Repeated);
    }
    match jwt::read(raw, claim, unverified) {
        Reading::NoToken | Reading::Claim(None) => Ok(None),
        Reading::Unreadable => Err(Problem::Unreadable),
        Reading::TooLong(payload) => Ok(Some(escape(payload))),
        Reading::Claim(Some(value)) => Ok(key_safe(value.trim().as_bytes()).map(Cow::into_owned)),
    }
}

fn trimmed(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn parse_ip(text: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(text).ok()?.trim();
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

fn peer_ip(req: &impl RequestView) -> Option<IpAddr> {
    parse_ip(&req.source_address()?)
}

/// The client's address as a key value: IPv4 whole, IPv6 as its network of
/// `ipv6_prefix` bits (`2001:db8:1:2::/64`), since one client holds a whole /64 and may
/// use any address in it. IPv4-mapped IPv6 (`::ffff:a.b.c.d`, from dual-stack sockets)
/// counts as the IPv4 it is, or every IPv4 client would share one /64.
fn client_address(req: &impl RequestView, address: &Address) -> Option<String> {
    let ip = match address.forwarded {
        Some(forwarded) => forwarded_ip(req, forwarded).or_else(|| peer_ip(req)),
        None => peer_ip(req),
    }?;
    let text = match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) if address.ipv6_prefix >= 128 => v6.to_string(),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & (u128::MAX << (128 - u32::from(address.ipv6_prefix)));
            format!("{}/{}", Ipv6Addr::from(bits), address.ipv6_prefix)
        }
    };
    Some(escape(text.as_bytes()))
}

/// The address written by the outermost of `hops` trusted proxies in front of the gateway:
/// the `hops`-th entry from the right, not counting the one the gateway appended itself
/// (`gateway_appends`; Envoy appends the peer, or its own address when the peer is
/// loopback, so the entry cannot be recognized by its value). Entries further left were
/// written by the client and are never trusted.
///
/// The header is a list: its copies, however the host delivers them (apart, or joined with
/// commas as Envoy does), are read as one list in order, so a proxy that adds a copy rather
/// than appending to the client's is read right.
fn forwarded_ip(req: &impl RequestView, forwarded: Forwarded) -> Option<IpAddr> {
    let copies = req.header_list("x-forwarded-for");
    let hops = usize::try_from(forwarded.hops).ok()?;
    let skip = usize::from(forwarded.gateway_appends);
    let entry = copies
        .iter()
        .rev()
        .flat_map(|copy| copy.split(|&b| b == b',').rev())
        .nth(hops.checked_sub(1)? + skip)?;
    parse_ip(entry)
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "identity_jwt_tests.rs"]
mod jwt_tests;

#[cfg(test)]
#[path = "body_reading_tests.rs"]
mod body_reading_tests;
