//! The numbers and byte layouts of proxy-wasm ABI 0.2.1, as Envoy speaks them.
//!
//! The Rust SDK panics (and so traps the guest) on any status it does not expect from a
//! host call, so the harness must return exactly the statuses Envoy returns: they live here.

/// `WasmResult` codes of proxy-wasm (the subset a 0.2.1 host returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    BrokenConnection = 11,
    Unimplemented = 12,
}

impl Status {
    /// The value handed back to the guest.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// What a stream callback asks the host to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on with the next filter.
    Continue,
    /// Stop iteration until the filter resumes or replies.
    Pause,
}

impl Action {
    /// Envoy reads 0 as continue and anything else as stop.
    pub fn from_code(code: i32) -> Action {
        if code == 0 {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}

/// Header maps a 0.2.1 guest may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    GrpcInitialMetadata,
    GrpcTrailingMetadata,
    CallResponseHeaders,
    CallResponseTrailers,
}

impl MapType {
    pub fn from_code(code: i32) -> Option<MapType> {
        Some(match code {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            4 => MapType::GrpcInitialMetadata,
            5 => MapType::GrpcTrailingMetadata,
            6 => MapType::CallResponseHeaders,
            7 => MapType::CallResponseTrailers,
            _ => return None,
        })
    }
}

/// Buffers a 0.2.1 guest may name, plus Higress's redis reply (9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferType {
    RequestBody,
    ResponseBody,
    DownstreamData,
    UpstreamData,
    CallResponseBody,
    GrpcReceive,
    VmConfiguration,
    PluginConfiguration,
    CallData,
    RedisCallResponse,
}

impl BufferType {
    pub fn from_code(code: i32) -> Option<BufferType> {
        Some(match code {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::CallResponseBody,
            5 => BufferType::GrpcReceive,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            9 => BufferType::RedisCallResponse,
            _ => return None,
        })
    }
}

/// Log levels of `proxy_log`, trace (0) to critical (5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    pub fn from_code(code: i32) -> Option<LogLevel> {
        Some(match code {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// One header (or trailer, or metadata) entry; bytes, because clients send non-UTF-8.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Header pairs from text, names lower-cased as Envoy hands them to wasm.
pub fn pairs(headers: &[(&str, &str)]) -> Vec<Pair> {
    headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase().into_bytes(), v.as_bytes().to_vec()))
        .collect()
}

/// First value of `name` in `pairs`, lossily decoded.
pub fn first(pairs: &[Pair], name: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// Serializes pairs as Envoy does: count, then each key and value size, then each key and
/// value followed by a NUL (all integers u32 little-endian).
pub fn encode_pairs(pairs: &[Pair]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + 8 * pairs.len() + data);
    out.extend_from_slice(&len_u32(pairs.len()).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&len_u32(k.len()).to_le_bytes());
        out.extend_from_slice(&len_u32(v.len()).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A count or size (headers, body bytes) as the `i32` parameter a callback takes.
pub(crate) fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Parses Envoy's pair serialization; `None` if the bytes are not exactly one such map.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<Pair>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let mut at = 0usize;
    let word = |at: &mut usize| -> Option<usize> {
        let b = bytes.get(*at..at.checked_add(4)?)?;
        *at += 4;
        usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
    };
    let count = word(&mut at)?;
    // Each pair needs at least 10 bytes: refuse counts the input cannot hold.
    if count > bytes.len() / 10 + 1 {
        return None;
    }
    let mut sizes = Vec::with_capacity(count);
    for _ in 0..count {
        sizes.push((word(&mut at)?, word(&mut at)?));
    }
    let mut pairs = Vec::with_capacity(count);
    for (k, v) in sizes {
        let key = bytes.get(at..at.checked_add(k)?)?.to_vec();
        at += k;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        let value = bytes.get(at..at.checked_add(v)?)?.to_vec();
        at += v;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        pairs.push((key, value));
    }
    (at == bytes.len()).then_some(pairs)
}

/// Splits a property path as the SDK serializes it (segments joined by NUL).
pub fn property_path(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.split(|&b| b == 0).map(<[u8]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_in_envoys_layout() {
        let pairs: Vec<Pair> = vec![
            (b":status".to_vec(), b"200".to_vec()),
            (b"x".to_vec(), Vec::new()),
        ];
        let bytes = encode_pairs(&pairs);
        let mut expect = vec![2, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        expect.extend_from_slice(b":status\x00200\x00x\x00\x00");
        assert_eq!(bytes, expect);
        assert_eq!(decode_pairs(&bytes), Some(pairs));
    }

    #[test]
    fn truncated_or_lying_maps_are_refused() {
        let bytes = encode_pairs(&[(b"a".to_vec(), b"b".to_vec())]);
        for cut in 1..bytes.len() {
            assert_eq!(decode_pairs(&bytes[..cut]), None, "{cut}");
        }
        assert_eq!(decode_pairs(&[0xff, 0xff, 0xff, 0x7f]), None);
    }
}
