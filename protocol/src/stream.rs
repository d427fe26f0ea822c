//! The stream transport's envelope: each message on the long-lived stream is the exchange
//! id, `\n`, then a batch (or its answer), so that replies can come back in any order and
//! a late one is recognised as such. gRPC's framing of the messages is `grpc_frame`'s.

use crate::bounds::MAX_ID_LINE;
use crate::number::push_u64;

/// A stream message carrying `body` for exchange `id`.
pub fn stream_message(id: u32, body: &str) -> String {
    let mut message = String::with_capacity(MAX_ID_LINE + body.len());
    push_u64(&mut message, u64::from(id));
    message.push('\n');
    message.push_str(body);
    message
}

/// The exchange id and the body of a stream message; `None` if it has no valid id line.
pub fn split_message(message: &[u8]) -> Option<(u32, &[u8])> {
    let head = &message[..message.len().min(MAX_ID_LINE)];
    let newline = head.iter().position(|&b| b == b'\n')?;
    let digits = &message[..newline];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let id = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((id, &message[newline + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_exchange_id() {
        let m = stream_message(4_294_967_295, "k,1,1,1,1\n");
        assert_eq!(m, "4294967295\nk,1,1,1,1\n");
        assert_eq!(
            split_message(m.as_bytes()),
            Some((u32::MAX, &b"k,1,1,1,1\n"[..]))
        );
        assert_eq!(split_message(b"7\n"), Some((7, &b""[..])));
    }

    #[test]
    fn messages_without_a_valid_id_are_refused() {
        for m in [
            &b""[..],
            b"\nk,1,1,1,1\n",
            b"k,1,1,1,1\n",
            b"-1\nx",
            b"4294967296\nx",
            b"12345678901234567890\nx",
            b"7",
            b"+7\nx",
        ] {
            assert_eq!(split_message(m), None, "{:?}", String::from_utf8_lossy(m));
        }
    }
}
