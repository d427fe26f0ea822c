//! Live mode: a callout forwarded to a real bridge as a plain HTTP/1.1 request, so a test
//! can run the real wasm against the real bridge and Redis without Envoy.
//!
//! Failures map to what Envoy's router would hand the filter: 503 when the bridge cannot be
//! reached or drops the connection, 504 when it does not answer within the callout timeout.
//!
//! A gRPC stream message carries the same batch behind an id line (`id\n` + the
//! `/v1/check` body); it is forwarded as that HTTP request and answered as `id\n` + the
//! reply body, so one bridge endpoint serves both transports here.
//!
//! A redis call (the Higress ABI) goes to a real Redis as the raw RESP the guest wrote.

use crate::abi::{first, pairs};
use crate::callout::{CallResponse, Callout, CalloutState};
use crate::redis::resp_len;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest reply read from a bridge; more is a broken bridge.
const MAX_REPLY: usize = 1 << 20;

/// How long a forwarded stream message may take. Envoy has no per-message timeout; a test
/// must not hang on a stuck bridge.
const STREAM_MESSAGE_TIMEOUT_MS: u32 = 2_000;

/// Forwards one stream message (`id\n` + batch) to the bridge at `addr` as a `POST` of the
/// batch; the reply message (`id\n` + reply body), or why the stream fails.
pub fn forward_message(
    addr: SocketAddr,
    upstream: &str,
    message: &[u8],
) -> Result<Vec<u8>, String> {
    let Some((_, batch)) = ratelimit_protocol::split_message(message) else {
        return Err("stream message without an exchange id".into());
    };
    let id_line = &message[..message.len() - batch.len()];
    let callout = Callout {
        token: 0,
        context_id: 0,
        upstream: upstream.to_owned(),
        headers: pairs(&[
            (":method", "POST"),
            (":path", ratelimit_protocol::PATH),
            (":authority", upstream),
            ("content-type", "text/plain"),
        ]),
        body: batch.to_vec(),
        trailers: Vec::new(),
        timeout_ms: STREAM_MESSAGE_TIMEOUT_MS,
        dispatched_ns: 0,
        state: CalloutState::Pending,
    };
    let reply = forward(addr, &callout);
    if reply.status() != Some(200) {
        return Err(format!(
            "bridge answered {}: {}",
            reply.status().unwrap_or(0),
            String::from_utf8_lossy(&reply.body)
        ));
    }
    let mut out = id_line.to_vec();
    out.extend_from_slice(&reply.body);
    Ok(out)
}

/// Sends `callout` to `addr` and returns the reply as Envoy would deliver it.
pub fn forward(addr: SocketAddr, callout: &Callout) -> CallResponse {
    let timeout = Duration::from_millis(u64::from(callout.timeout_ms.max(1)));
    match exchange(addr, callout, timeout) {
        Ok(Some(reply)) => reply,
        Ok(None) => CallResponse::envoy_unreachable("protocol error"),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            CallResponse::envoy_timeout()
        }
        Err(e) => CallResponse::envoy_unreachable(&e.to_string()),
    }
}

/// Runs `query` (raw RESP) on the Redis at `addr` and returns its raw RESP reply.
pub fn execute_redis(
    addr: SocketAddr,
    query: &[u8],
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(query)?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(len) = resp_len(&reply, 0) {
            reply.truncate(len);
            return Ok(reply);
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&chunk[..n]);
    }
}

fn exchange(
    addr: SocketAddr,
    callout: &Callout,
    timeout: Duration,
) -> std::io::Result<Option<CallResponse>> {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.write_all(&request_bytes(callout))?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = timeout
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero());
        let Some(left) = left else {
            return Err(std::io::ErrorKind::TimedOut.into());
        };
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
        if raw.len() > MAX_REPLY {
            return Ok(None);
        }
        if let Some(reply) = parse(&raw, false) {
            return Ok(Some(reply));
        }
    }
    Ok(parse(&raw, true))
}

fn request_bytes(callout: &Callout) -> Vec<u8> {
    let method = callout.header(":method").unwrap_or_else(|| "POST".into());
    let path = callout.header(":path").unwrap_or_else(|| "/".into());
    let host = callout
        .header(":authority")
        .unwrap_or_else(|| callout.upstream.clone());
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n").into_bytes();
    for (k, v) in &callout.headers {
        if k.first() == Some(&b':') || k.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            callout.body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(&callout.body);
    out
}

/// Parses a complete response; `None` while incomplete (or, at EOF, if malformed).
fn parse(raw: &[u8], eof: bool) -> Option<CallResponse> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u32 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut headers = vec![(b":status".to_vec(), status.to_string().into_bytes())];
    for line in lines {
        let (k, v) = line.split_once(':')?;
        headers.push((
            k.trim().to_ascii_lowercase().into_bytes(),
            v.trim().as_bytes().to_vec(),
        ));
    }
    let rest = &raw[head_end + 4..];
    let value = |name: &str| first(&headers, name);
    let body = if value("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = value("content-length").and_then(|l| l.parse::<usize>().ok()) {
        rest.get(..len)?.to_vec()
    } else if eof {
        rest.to_vec()
    } else {
        return None;
    };
    Some(CallResponse {
        headers,
        body,
        trailers: Vec::new(),
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_with_length_chunks_or_eof() {
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", false).unwrap();
        assert_eq!((r.status(), r.body.as_slice()), (Some(200), &b"abc"[..]));
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(r.body, b"abc");
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\nab", false).is_none());
        assert_eq!(
            parse(b"HTTP/1.1 502 Bad\r\n\r\nab", true).unwrap().status(),
            Some(502)
        );
        assert!(parse(b"garbage\r\n\r\n", true).is_none());
    }
}
