//! The reader's text paths (a request's `model`, an identity): the string as the upstream's
//! JSON parser decodes it, split anywhere, or unreadable where it may decode otherwise.

use super::tests::paths;
use super::{BodyFormat, Text, UsageReader, MAX_TEXT_LEN};

/// What `body`, fed in `pieces`, holds at the text path `model` (`Some(None)`: something
/// unreadable; `None`: nothing), the count `max_tokens` beside it, and whether the reading
/// is trusted.
type Got = (Option<Option<Vec<u8>>>, Option<u64>, bool);

fn model_in(pieces: &[&[u8]]) -> Got {
    let mut reader =
        UsageReader::with_texts(BodyFormat::Json, paths(&["max_tokens"]), paths(&["model"]));
    for piece in pieces {
        reader.feed(piece);
    }
    reader.finish();
    let text = match reader.text(0) {
        Text::Absent => None,
        Text::Unreadable | Text::Bool(_) => Some(None),
        Text::Str(s) => Some(Some(s.to_vec())),
    };
    (text, reader.values()[0], reader.trusted())
}

fn string(s: &str) -> Option<Option<Vec<u8>>> {
    Some(Some(s.as_bytes().to_vec()))
}

const ABSENT: Option<Option<Vec<u8>>> = None;
const UNREADABLE: Option<Option<Vec<u8>>> = Some(None);

/// `body`, asserted to read the same cut at every byte.
fn model(body: &str) -> Got {
    let whole = model_in(&[body.as_bytes()]);
    for at in 0..=body.len() {
        let (a, b) = body.as_bytes().split_at(at);
        assert_eq!(model_in(&[a, b]), whole, "cut at {at} of {body}");
    }
    whole
}

#[test]
fn a_string_at_a_text_path_is_read_as_decoded_beside_the_counts() {
    let body = r#"{"messages": [{"model": "inner"}], "model": "gpt-4o", "max_tokens": 30}"#;
    assert_eq!(model(body), (string("gpt-4o"), Some(30), true));
    // Escapes decode to what the upstream reads: `gpt-4o` however it is written.
    let escaped = r#"{"model": "gpt\u002d4\/o\\\"", "stream": true}"#;
    assert_eq!(model(escaped).0, string("gpt-4/o\\\""));
    // UTF-8 written as it is passes through as bytes.
    assert_eq!(model(r#"{"model": "modèle"}"#).0, string("modèle"));
}

#[test]
fn no_field_or_null_is_absent_and_anything_but_a_readable_string_is_unreadable() {
    for absent in [r#"{"model": null}"#, "{}", r#"{"m": {"model": "x"}}"#, "[]"] {
        assert_eq!(model(absent).0, ABSENT, "{absent}");
    }
    let long = format!(r#"{{"model": "{}"}}"#, "m".repeat(MAX_TEXT_LEN + 1));
    let longest = format!(r#"{{"model": "{}"}}"#, "m".repeat(MAX_TEXT_LEN));
    assert_eq!(model(&longest).0, string(&"m".repeat(MAX_TEXT_LEN)));
    for unreadable in [
        r#"{"model": 5}"#,
        r#"{"model": true}"#,
        r#"{"model": ["gpt-4o"]}"#,
        r#"{"model": {"name": "gpt-4o"}}"#,
        r#"{"model": "caf\u00e9"}"#,
        long.as_str(),
    ] {
        assert_eq!(model(unreadable).0, UNREADABLE, "{unreadable:.40}");
    }
    // A number at a text path is not a count: the reserve beside it still reads.
    assert_eq!(
        model(r#"{"model": 5, "max_tokens": 7}"#),
        (UNREADABLE, Some(7), true)
    );
}

#[test]
fn a_repeated_text_key_is_not_trusted_and_the_last_value_stands() {
    let (text, _, trusted) = model(r#"{"model": "cheap", "model": "dear"}"#);
    assert_eq!(text, string("dear"));
    assert!(!trusted);
}

#[test]
fn a_reader_of_texts_allocates_only_when_built() {
    let mut reader =
        UsageReader::with_texts(BodyFormat::Json, paths(&["max_tokens"]), paths(&["model"]));
    let before = super::tests::allocations();
    for _ in 0..3 {
        reader.feed(br#"{"model": "gpt-4o-mini-2024-07-18", "max_tokens": 1}"#);
    }
    assert_eq!(super::tests::allocations(), before);
}
