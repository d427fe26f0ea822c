//! Holds the metering reader (`UsageReader`, which reads a metered response's usage and a
//! request body's `max_tokens`) to any bytes, as one JSON value or as server-sent events:
//! cut into pieces of any size it reads exactly as whole, it never panics, every count it
//! gives is at most `MAX_COUNT`, and it counts every byte fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_filter::metering::{BodyFormat, UsageReader, MAX_COUNT};

/// OpenAI's and Anthropic's usage fields, a reservation's `max_tokens`, and a deep path.
const PATHS: &[&str] = &[
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "message.usage.input_tokens",
    "max_tokens",
    "a.b.c.d",
];

/// Each path's last and largest count, whether it was poisoned, whether it can be trusted.
type Reading = (Vec<Option<u64>>, Vec<Option<u64>>, bool, bool);

fn read(format: BodyFormat, pieces: &[&[u8]]) -> Reading {
    let paths = PATHS
        .iter()
        .map(|p| p.split('.').map(String::from).collect())
        .collect();
    let mut reader = UsageReader::new(format, paths);
    let mut fed = 0;
    for piece in pieces {
        reader.feed(piece);
        fed += piece.len() as u64;
    }
    reader.finish();
    assert_eq!(reader.bytes(), fed, "bytes fed");
    (
        reader.values().to_vec(),
        reader.largest().to_vec(),
        reader.poisoned(),
        reader.trusted(),
    )
}

// The first byte picks the format (its low bit) and the size of the pieces (the rest).
fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let format = match control & 1 {
        0 => BodyFormat::Json,
        _ => BodyFormat::EventStream,
    };
    let whole = read(format, &[body]);
    assert!(
        whole.1.iter().flatten().all(|&n| n <= MAX_COUNT),
        "{whole:?}"
    );
    // The largest count at a path is at least its last.
    assert!(whole
        .0
        .iter()
        .zip(&whole.1)
        .all(|(last, largest)| last <= largest));
    let size = usize::from(control >> 1) + 1;
    let pieces: Vec<&[u8]> = body.chunks(size).collect();
    assert_eq!(read(format, &pieces), whole, "in pieces of {size}");
    if size > 1 {
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(read(format, &bytes), whole, "a byte at a time");
    }
});
