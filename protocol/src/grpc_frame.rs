//! gRPC's framing of a message (a 5-byte prefix: not compressed, then the length), for
//! every reader and writer of the stream's bytes rather than its messages: the bridge's
//! doors, the native module, the bench's load generator and the fuzz target. Written once,
//! with no dependency, so that a load generator or a fuzz target need not build the bridge.

use crate::bounds::{MAX_BODY, MAX_ID_LINE};

/// Largest stream-transport message: an envelope around the largest batch.
const MAX_STREAM_MESSAGE: usize = MAX_ID_LINE + MAX_BODY;

/// gRPC's prefix of a message of `len` bytes: not compressed, then the length, big-endian.
fn grpc_prefix(len: usize) -> [u8; 5] {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [0, len[0], len[1], len[2], len[3]]
}

/// The length of the gRPC message whose prefix begins `bytes`: `Ok(None)` until the prefix
/// is whole; an error for a compressed message or one longer than `max`.
fn grpc_message_len(bytes: &[u8], max: usize) -> Result<Option<usize>, String> {
    let Some(&[flag, a, b, c, d]) = bytes.get(..5) else {
        return Ok(None);
    };
    if flag != 0 {
        return Err("compressed messages are not supported".into());
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len > max {
        return Err(format!("message of {len} bytes exceeds {max}"));
    }
    Ok(Some(len))
}

/// `message` with gRPC's length prefix.
pub fn prefixed(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.extend_from_slice(&grpc_prefix(message.len()));
    out.extend_from_slice(message);
    out
}

/// Splits a byte stream, however it arrives in chunks, into gRPC messages of at most `max`
/// bytes.
pub struct Deframer {
    buf: Vec<u8>,
    /// Where the first message not yet taken begins in `buf`.
    start: usize,
    max: usize,
}

impl Default for Deframer {
    /// For the stream transport's messages.
    fn default() -> Deframer {
        Deframer::with_limit(MAX_STREAM_MESSAGE)
    }
}

impl Deframer {
    pub fn with_limit(max: usize) -> Deframer {
        Deframer {
            buf: Vec::new(),
            start: 0,
            max,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        // What was taken goes before more comes: the buffer holds at most one partial
        // message besides what has just arrived.
        self.buf.drain(..self.start);
        self.start = 0;
        self.buf.extend_from_slice(data);
    }

    /// Whether part of a message has arrived and the rest has not.
    pub fn is_partway(&self) -> bool {
        self.start < self.buf.len()
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, String> {
        let rest = &self.buf[self.start..];
        let Some(len) = grpc_message_len(rest, self.max)? else {
            return Ok(None);
        };
        let Some(message) = rest.get(5..5 + len) else {
            return Ok(None);
        };
        let message = message.to_vec();
        self.start += 5 + len;
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_prefix_is_read_back_once_whole() {
        let prefix = grpc_prefix(70_000);
        assert_eq!(prefix, [0, 0, 1, 0x11, 0x70]);
        for cut in 0..5 {
            assert_eq!(grpc_message_len(&prefix[..cut], 1 << 20), Ok(None));
        }
        assert_eq!(grpc_message_len(&prefix, 1 << 20), Ok(Some(70_000)));
        assert!(grpc_message_len(&prefix, 69_999).is_err());
        assert!(grpc_message_len(&[1, 0, 0, 0, 0], 10).is_err());
    }

    #[test]
    fn messages_split_across_and_within_chunks() {
        let mut d = Deframer::default();
        let mut both = prefixed(b"7\nk,1,1,1,1\n");
        both.extend_from_slice(&prefixed(b""));
        both.extend_from_slice(&prefixed(b"8\n")[..4]);
        d.push(&both[..3]);
        assert_eq!(d.next_message(), Ok(None));
        d.push(&both[3..]);
        assert_eq!(d.next_message().unwrap().unwrap(), b"7\nk,1,1,1,1\n");
        assert_eq!(d.next_message().unwrap().unwrap(), b"");
        assert_eq!(d.next_message(), Ok(None));
        assert!(d.is_partway());
        d.push(&prefixed(b"8\n")[4..]);
        assert_eq!(d.next_message().unwrap().unwrap(), b"8\n");
        assert!(!d.is_partway());
    }

    #[test]
    fn compressed_or_oversized_messages_are_refused() {
        let mut d = Deframer::default();
        d.push(&[1, 0, 0, 0, 1, b'x']);
        assert!(d.next_message().is_err());
        let mut d = Deframer::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_message().unwrap_err().contains("exceeds"));
    }
}
