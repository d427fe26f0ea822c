//! The Higress redis-call ABI: `proxy_redis_init`, `proxy_redis_call`, the
//! `proxy_on_redis_call_response` callback and the reply in buffer type 9. Stock Envoy has
//! none of it; serving it here lets the redis-call build be tested the day it exists.
//!
//! This is what the guest declared and asked for, and the RESP it is asked in; the host
//! functions filling it are in `hostcalls`. Queries and replies are raw RESP; a test
//! answers them, or live mode runs them on Redis.

/// A cluster the guest declared with `proxy_redis_init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisCluster {
    pub name: String,
    pub username: Vec<u8>,
    pub password: Vec<u8>,
    pub timeout_ms: u32,
}

/// One `proxy_redis_call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisCall {
    pub token: u32,
    pub cluster: String,
    /// The RESP-encoded command.
    pub query: Vec<u8>,
    pub answered: bool,
}

/// Redis-call state of one VM.
#[derive(Debug, Default, Clone)]
pub struct RedisState {
    pub clusters: Vec<RedisCluster>,
    pub calls: Vec<RedisCall>,
    /// The reply being delivered, only during `proxy_on_redis_call_response`.
    pub reply: Option<Vec<u8>>,
}

/// Length of the complete RESP value at `at`, or `None` while it is incomplete.
pub fn resp_len(bytes: &[u8], at: usize) -> Option<usize> {
    let kind = *bytes.get(at)?;
    let line_end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let after = line_end + 2;
    let number = || -> Option<i64> {
        std::str::from_utf8(bytes.get(at + 1..line_end)?)
            .ok()?
            .parse()
            .ok()
    };
    match kind {
        b'+' | b'-' | b':' | b'_' | b'#' | b',' => Some(after),
        b'$' => match number()? {
            n if n < 0 => Some(after),
            n => {
                let end = after
                    .checked_add(usize::try_from(n).ok()?)?
                    .checked_add(2)?;
                (bytes.len() >= end).then_some(end)
            }
        },
        b'*' | b'%' => {
            let n = number()?;
            let items = if kind == b'%' { n.checked_mul(2)? } else { n };
            let mut end = after;
            for _ in 0..items.max(0) {
                end = resp_len(bytes, end)?;
            }
            Some(end)
        }
        _ => None,
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_values_are_measured_only_when_complete() {
        let reply = b"*2\r\n$3\r\nabc\r\n:5\r\n";
        assert_eq!(resp_len(reply, 0), Some(reply.len()));
        for cut in 0..reply.len() {
            assert_eq!(resp_len(&reply[..cut], 0), None, "{cut}");
        }
        assert_eq!(resp_len(b"$-1\r\n", 0), Some(5));
        assert_eq!(command(&[b"GET", b"k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
