//! Properties over random bodies (proptest, a fixed seed: the same cases every run, a
//! failing one shrunk): the reader agrees with a model built on `serde_json::Value`, in a
//! JSON body and in event streams, whatever the cuts; and any bytes at all, cut anywhere,
//! read the same as whole and never panic.

use super::tests::{read_pieces, Reading};
use super::{BodyFormat, UsageReader, MAX_COUNT};
use crate::fakes::check;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value};
use std::cell::Cell;

const PATHS: &[&str] = &[
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "a.usage.prompt_tokens",
    "we\"ird.a",
    "caf\u{e9}",
    "prompt_tokens",
];

/// Keys that make up the paths, and keys close to them.
const KEYS: &[&str] = &[
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "a",
    "we\"ird",
    "caf\u{e9}",
    "usage_x",
    "prompt_tokens2",
    "",
];

/// Mostly counts, then nulls, then a little of everything a path may not hold.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => (0..100_000u64).prop_map(Value::from),
        2 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => prop_oneof![Just(MAX_COUNT), Just(MAX_COUNT + 1), any::<u64>()].prop_map(Value::from),
        1 => (i64::MIN..0).prop_map(Value::from),
        1 => prop_oneof![Just(0.0), Just(-0.0), Just(1.5), any::<f64>()].prop_map(Value::from),
        1 => "[a-z\"\\\\{}\\[\\]:,\u{e9}\u{1F600}]{0,8}".prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS).prop_map(String::from)
}

/// An object of members from `KEYS`, and often a `usage` object of leaves.
fn object(inner: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    let tokens = prop::sample::select(&["prompt_tokens", "completion_tokens", "prompt_tokens2"]);
    let usage = prop::collection::vec((tokens.prop_map(String::from), leaf()), 0..4)
        .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>()));
    let member = prop_oneof![
        3 => (key(), inner),
        1 => (Just("usage".to_string()), usage),
    ];
    prop::collection::vec(member, 0..6)
        .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>()))
}

/// A root object, its members anything up to six levels deep.
fn root() -> impl Strategy<Value = Value> {
    let value = leaf().prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            object(inner),
        ]
    });
    object(value.boxed())
}

/// What the reader should find at `path` in `value`: its count, and whether it poisons.
fn model(value: &Value, path: &str) -> (Option<u64>, bool) {
    let mut at = value;
    for segment in path.split('.') {
        match at.as_object().and_then(|o| o.get(segment)) {
            Some(next) => at = next,
            None => return (None, false),
        }
    }
    match at {
        Value::Null => (None, false),
        Value::Number(n) => match n.as_u64() {
            Some(count) if count <= MAX_COUNT => (Some(count), false),
            _ => (None, true),
        },
        _ => (None, true),
    }
}

/// The model over a run of values, the last count at a path winning.
fn model_of(values: &[&Value]) -> Reading {
    let mut reading = (vec![None; PATHS.len()], false);
    for value in values {
        for (slot, path) in reading.0.iter_mut().zip(PATHS) {
            let (count, poisons) = model(value, path);
            *slot = count.or(*slot);
            reading.1 |= poisons;
        }
    }
    reading
}

/// `body` cut at `cuts`.
fn cut<'a>(body: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
    at.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = 0;
    for to in at.into_iter().chain([body.len()]) {
        pieces.push(&body[from..to]);
        from = to;
    }
    pieces
}

fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..12)
}

/// How many cases had a count, and how many a poison: the properties are only worth
/// something if both are common.
#[derive(Default)]
struct Seen {
    counts: Cell<u32>,
    poisons: Cell<u32>,
}

impl Seen {
    fn note(&self, reading: &Reading) {
        if reading.0.iter().any(Option::is_some) {
            self.counts.set(self.counts.get() + 1);
        }
        if reading.1 {
            self.poisons.set(self.poisons.get() + 1);
        }
    }

    fn assert_at_least(&self, each: u32) {
        let (counts, poisons) = (self.counts.get(), self.poisons.get());
        assert!(
            counts >= each && poisons >= each,
            "{counts} with counts, {poisons} poisoned"
        );
    }
}

#[test]
fn a_json_body_cut_anywhere_reads_as_the_model_says() {
    let seen = Seen::default();
    check(
        512,
        (root(), any::<bool>(), cuts()),
        |(value, pretty, cuts)| {
            let text = match pretty {
                true => serde_json::to_string_pretty(&value),
                false => serde_json::to_string(&value),
            }
            .unwrap();
            let got = read_pieces(BodyFormat::Json, PATHS, &cut(text.as_bytes(), &cuts));
            seen.note(&got);
            prop_assert_eq!(got, model_of(&[&value]), "{}", text);
            Ok(())
        },
    );
    seen.assert_at_least(64);
}

/// One event of a stream: its value (sent over several data lines when pretty), or a
/// line that is not JSON; a comment before it; its line ending.
type Event = (Option<(Value, bool)>, bool, usize);

#[test]
fn an_event_stream_cut_anywhere_reads_as_the_model_says() {
    let event = (
        prop::option::weighted(0.85, (root(), any::<bool>())),
        any::<bool>(),
        0..3usize,
    );
    let stream = prop::collection::vec(event, 0..6);
    let seen = Seen::default();
    check(256, (stream, cuts()), |(stream, cuts): (Vec<Event>, _)| {
        let mut body = String::new();
        for (value, comment, eol) in &stream {
            let eol = ["\n", "\r\n", "\r"][*eol];
            if *comment {
                body.push_str(&format!(": keep-alive{eol}event: x{eol}"));
            }
            let text = match value {
                Some((v, true)) => serde_json::to_string_pretty(v).unwrap(),
                Some((v, false)) => serde_json::to_string(v).unwrap(),
                None => "[DONE]".to_string(),
            };
            for line in text.lines() {
                body.push_str(&format!("data: {line}{eol}"));
            }
            body.push_str(eol);
        }
        let values: Vec<&Value> = stream
            .iter()
            .filter_map(|e| e.0.as_ref())
            .map(|v| &v.0)
            .collect();
        let got = read_pieces(BodyFormat::EventStream, PATHS, &cut(body.as_bytes(), &cuts));
        seen.note(&got);
        prop_assert_eq!(got, model_of(&values), "{:?}", body);
        Ok(())
    });
    seen.assert_at_least(32);
}

/// Bytes of every kind, or of the alphabet of JSON and events, to reach deeper states.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    let alphabet =
        b"{}[]\":,0123456789-.eE+ \t\r\n\\u/truefalsnul data:usage_prompt_tokens\xEF\xBB\xBF";
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        prop::collection::vec(prop::sample::select(alphabet.to_vec()), 0..600),
        prop::collection::vec(
            prop::sample::select(vec![
                &b"data: "[..],
                b"{\"usage\":",
                b"{\"prompt_tokens\":",
                b"[",
                b"]",
                b"}",
                b"12",
                b"-0",
                b"null",
                b",",
                b"\"\\\"",
                b"\n",
                b"\r\n",
                b"\n\n",
            ]),
            0..80
        )
        .prop_map(|parts| parts.concat()),
    ]
}

#[test]
fn any_bytes_cut_anywhere_read_as_whole_and_never_panic() {
    let list = &["usage.prompt_tokens", "prompt_tokens", "usage"];
    check(2048, (bytes(), cuts()), |(body, cuts)| {
        for format in [BodyFormat::Json, BodyFormat::EventStream] {
            let whole = read_pieces(format, list, &[&body]);
            prop_assert!(whole.0.iter().flatten().all(|&n| n <= MAX_COUNT));
            prop_assert_eq!(read_pieces(format, list, &cut(&body, &cuts)), whole.clone());
            let bytes: Vec<&[u8]> = body.chunks(1).collect();
            prop_assert_eq!(read_pieces(format, list, &bytes), whole);
        }
        Ok(())
    });
}

#[test]
fn a_reader_of_no_paths_or_of_paths_it_cannot_match_reads_anything_without_values() {
    let unusable = vec![vec![], vec!["a".to_string(); 9], vec!["k".repeat(65)]];
    check(256, bytes(), |body| {
        for list in [Vec::new(), unusable.clone()] {
            let mut reader = UsageReader::new(BodyFormat::EventStream, list.clone());
            reader.feed(&body);
            reader.finish();
            prop_assert_eq!(reader.values().len(), list.len());
            prop_assert!(reader.values().iter().all(Option::is_none));
            prop_assert!(!reader.poisoned());
        }
        Ok(())
    });
}
