//! Holds the gRPC `Deframer` the bridge reads its streams with to splitting any byte stream, however it arrives in
//! chunks, into the same messages (or the same refusal), each exactly as framed on the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_protocol::{prefixed, Deframer};

fuzz_target!(|data: &[u8]| {
    // The first byte sets the chunk size, the rest is the stream.
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let chunked = deframe(stream.chunks(usize::from(size) + 1));
    assert_eq!(chunked, deframe([stream]));
    let framed: Vec<u8> = chunked.0.iter().flat_map(|m| prefixed(m)).collect();
    assert!(stream.starts_with(&framed));
});

/// The messages read from `chunks` pushed one by one, and the error that ended them.
fn deframe<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Vec<u8>>, Option<String>) {
    let mut deframer = Deframer::default();
    let mut messages = Vec::new();
    for chunk in chunks {
        deframer.push(chunk);
        loop {
            match deframer.next_message() {
                Ok(Some(message)) => messages.push(message.to_vec()),
                Ok(None) => break,
                Err(e) => return (messages, Some(e)),
            }
        }
    }
    (messages, None)
}
