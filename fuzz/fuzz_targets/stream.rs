//! Holds `split_message` to finding the exchange id of any stream message, or none, without
//! panicking, and to reading back the id and body of any message `stream_message` writes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_protocol::{split_message, stream_message, MAX_ID_LINE};

fuzz_target!(|message: &[u8]| {
    let Some((id, body)) = split_message(message) else {
        return;
    };
    let id_line = &message[..message.len() - body.len()];
    assert!(id_line.len() <= MAX_ID_LINE && id_line.ends_with(b"\n"));
    if let Ok(text) = std::str::from_utf8(body) {
        let again = stream_message(id, text);
        assert_eq!(split_message(again.as_bytes()), Some((id, body)));
    }
});
