//! Holds the metering reader (`UsageReader`, which reads a metered response's usage, a
//! request body's `max_tokens` and its `model`) to any bytes, as one JSON value or as
//! server-sent events: cut into pieces of any size it reads exactly as whole, it never
//! panics, every count it gives is at most `MAX_COUNT`, every text at most `MAX_TEXT_LEN`
//! bytes, and it counts every byte fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_filter::metering::{BodyFormat, Text, UsageReader, MAX_COUNT, MAX_TEXT_LEN};

/// OpenAI's and Anthropic's usage fields, a reservation's `max_tokens`, and a deep path.
const PATHS: &[&str] = &[
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "message.usage.input_tokens",
    "max_tokens",
    "a.b.c.d",
];

/// Text paths: a request's model, and one below an object.
const TEXTS: &[&str] = &["model", "message.model"];

/// Each path's last and largest count, whether it was poisoned, whether it can be trusted,
/// and each text path's last value (`Some(None)`: unreadable).
type Reading = (
    Vec<Option<u64>>,
    Vec<Option<u64>>,
    bool,
    bool,
    Vec<Option<Option<Vec<u8>>>>,
);

fn split(list: &[&str]) -> Vec<Vec<String>> {
    list.iter()
        .map(|p| p.split('.').map(String::from).collect())
        .collect()
}

fn read(format: BodyFormat, pieces: &[&[u8]]) -> Reading {
    let mut reader = UsageReader::with_texts(format, split(PATHS), split(TEXTS));
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
        (0..TEXTS.len())
            .map(|i| match reader.text(i) {
                Text::Absent => None,
                Text::Unreadable => Some(None),
                Text::Bool(b) => Some(Some(vec![u8::from(b)])),
                Text::Str(s) => Some(Some(s.to_vec())),
            })
            .collect(),
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
    assert!(
        whole
            .4
            .iter()
            .flatten()
            .flatten()
            .all(|t| t.len() <= MAX_TEXT_LEN),
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
