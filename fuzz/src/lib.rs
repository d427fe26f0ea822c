//! What the fuzz targets share: a request made of fuzz bytes, and well-formed tokens around
//! any claim (raw fuzz bytes are rarely base64 of JSON, so without them the fuzzer would
//! hardly ever get past the JWT decoding to what is done with a claim).

use ratelimit_filter::host::{RequestView, Sole};

/// A request whose every header name is answered by one of `headers`, picked by a hash of
/// the name: whatever headers a configuration reads, the fuzzer controls their values
/// without having to guess the names. An empty value is an absent header; a value that
/// starts with byte 1 stands for a header the request carries twice (and, for a list
/// header, byte 1 separates its copies).
pub struct Request {
    pub peer: Option<Vec<u8>>,
    pub headers: Vec<Vec<u8>>,
}

impl Request {
    /// The peer address on the first line, header values on the others.
    pub fn from_lines(data: &[u8]) -> Request {
        let mut lines = data.split(|&b| b == b'\n').map(<[u8]>::to_vec);
        Request {
            peer: lines.next().filter(|peer| !peer.is_empty()),
            headers: lines.collect(),
        }
    }
}

impl Request {
    fn value(&self, name: &str) -> Option<&Vec<u8>> {
        let hash = name.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        });
        let value = self.headers.get(hash.checked_rem(self.headers.len())?)?;
        (!value.is_empty()).then_some(value)
    }
}

impl RequestView for Request {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.value(name).map(Vec::as_slice)
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        match self.value(name) {
            None => Sole::Absent,
            Some(v) if v.first() == Some(&1) => Sole::Repeated,
            Some(v) => Sole::Once(v),
        }
    }

    /// Byte 1 separates copies.
    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.value(name)
            .map(|v| v.split(|&b| b == 1).collect())
            .unwrap_or_default()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        self.peer.clone()
    }

    fn route_name(&self) -> Option<Vec<u8>> {
        self.value("route_name").cloned()
    }
}

/// A JWT payload as Envoy's `jwt_authn` forwards it: base64url of `{"sub": sub}`.
pub fn payload(sub: &str) -> String {
    base64url(serde_json::json!({ "sub": sub }).to_string().as_bytes())
}

/// A bearer token carrying `payload`, its signature unchecked as `unverified` reads it.
pub fn bearer(payload: &str) -> String {
    format!("Bearer e30.{payload}.c2ln")
}

fn base64url(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// A reply fuzz input: the first line's bytes are the rule counts of the checks sent (each
/// at most `max_rules`), the rest is the reply.
pub fn counts_and_reply(data: &[u8], max_rules: usize) -> (Vec<usize>, &[u8]) {
    let mut parts = data.splitn(2, |&b| b == b'\n');
    let counts = parts
        .next()
        .unwrap_or_default()
        .iter()
        .map(|&b| usize::from(b.wrapping_sub(b'0')) % (max_rules + 1))
        .collect();
    (counts, parts.next().unwrap_or_default())
}
