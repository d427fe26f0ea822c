//! The body reader against the readers of the upstreams behind it: for random bodies built
//! to make parsers disagree (keys in other letter cases and Go's four folding characters,
//! written raw or escaped, repeated keys, nested objects, byte order marks, UTF-16 and
//! UTF-32, non-string values), the identity the filter reads from a body field is what
//! each reference reads there, or the request is refused. The references: Python's
//! `json.loads` on the bytes (its encoding detection, then exact keys, the last winning),
//! Go's `encoding/json` into a struct (keys matched case-insensitively as Go folds them,
//! the last winning, a nested object merged into what an earlier one set), and serde_json
//! (exact, the last winning; JavaScript's `JSON.parse` reads the same). A planted bug in
//! the filter's reading, forgetting what makes a body ambiguous, must be caught.

use super::{body_value, BodyRead, Problem};
use crate::metering::UsageReader;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use ratelimit_config::keys::key_safe;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;

/// A JSON value as a reader that keeps every member sees it.
#[derive(Debug, Clone)]
enum Raw {
    Object(Vec<(String, Raw)>),
    Str(String),
    Null,
    /// A number, a boolean or an array.
    Other,
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        struct RawVisitor;
        impl<'de> Visitor<'de> for RawVisitor {
            type Value = Raw;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
                let mut members = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Raw>()? {
                    members.push((key, value));
                }
                Ok(Raw::Object(members))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Raw::Other)
            }
            fn visit_str<E>(self, s: &str) -> Result<Raw, E> {
                Ok(Raw::Str(s.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Raw, E> {
                Ok(Raw::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Raw, E> {
                Ok(Raw::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Raw, E> {
                Ok(Raw::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Raw, E> {
                Ok(Raw::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Raw, E> {
                Ok(Raw::Other)
            }
        }
        d.deserialize_any(RawVisitor)
    }
}

/// Go's folding of a name (`appendFoldedName`): ASCII letters upper-cased, any other
/// character `unicode.ToUpper(unicode.ToLower(c))`, Go's simple case mappings (std's full
/// mappings agree on the first character; `İ` lower-cases to `i` and a combining dot).
/// Written apart from the filter's table on purpose.
fn go_folded(name: &str) -> String {
    let fold = |c: char| {
        if c.is_ascii() {
            return c.to_ascii_uppercase();
        }
        let lower = c.to_lowercase().next().unwrap_or(c);
        let mut upper = lower.to_uppercase();
        match (upper.next(), upper.next()) {
            (Some(u), None) => u,
            _ => lower,
        }
    };
    name.chars().map(fold).collect()
}

fn go_fold(key: &[u8], segment: &[u8]) -> bool {
    match (std::str::from_utf8(key), std::str::from_utf8(segment)) {
        (Ok(key), Ok(segment)) => go_folded(key) == go_folded(segment),
        _ => false,
    }
}

/// What a reference reader makes of the field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reading {
    /// The upstream refuses the body: no value to agree with.
    Refuses,
    /// No value (absent, `null`).
    Absent,
    Str(String),
    /// A number, a boolean, an object or an array: a value the filter cannot key on.
    Other,
}

/// Exact keys, the last winning (Python's dict, serde_json's `Value`, JavaScript).
fn exact(value: &Raw, path: &[&str]) -> Reading {
    let Some((first, rest)) = path.split_first() else {
        return match value {
            Raw::Str(s) => Reading::Str(s.clone()),
            Raw::Null => Reading::Absent,
            _ => Reading::Other,
        };
    };
    match value {
        Raw::Object(members) => match members.iter().rev().find(|(k, _)| k == first) {
            Some((_, inner)) => exact(inner, rest),
            None => Reading::Absent,
        },
        _ => Reading::Absent,
    }
}

/// Go's `encoding/json` into nested structs: every key Go folds to the field's name sets
/// it in turn; `null` leaves it as it was; an object decodes into the struct an earlier
/// one filled; a value of another type fails the whole `Unmarshal`.
fn go(value: &Raw, path: &[&str], mut found: Reading) -> Reading {
    let Some((first, rest)) = path.split_first() else {
        return match value {
            Raw::Str(s) => Reading::Str(s.clone()),
            Raw::Null => found,
            _ => Reading::Refuses,
        };
    };
    match value {
        Raw::Object(members) => {
            for (key, inner) in members {
                if go_fold(key.as_bytes(), first.as_bytes()) {
                    found = go(inner, rest, found);
                }
            }
            found
        }
        Raw::Null => found,
        _ => Reading::Refuses,
    }
}

fn serde_reads(body: &[u8], path: &[&str]) -> Reading {
    match serde_json::from_slice::<Raw>(body) {
        Ok(value) => exact(&value, path),
        Err(_) => Reading::Refuses,
    }
}

fn go_reads(body: &[u8], path: &[&str]) -> Reading {
    // Go decodes invalid UTF-8 as U+FFFD where serde refuses: the generator writes none.
    match serde_json::from_slice::<Raw>(body) {
        Ok(Raw::Object(members)) => go(&Raw::Object(members), path, Reading::Absent),
        Ok(_) => Reading::Absent,
        Err(_) => Reading::Refuses,
    }
}

/// Python's `json.loads(bytes)`: `json.detect_encoding`, the text decoded, then exact keys.
fn python_reads(body: &[u8], path: &[&str]) -> Reading {
    let units16 = |bytes: &[u8], big: bool| -> Vec<u16> {
        let pairs = bytes.chunks_exact(2).map(|p| [p[0], p[1]]);
        pairs
            .map(|p| match big {
                true => u16::from_be_bytes(p),
                false => u16::from_le_bytes(p),
            })
            .collect()
    };
    let utf16 = |bytes: &[u8], big: bool| -> Option<String> {
        (bytes.len() % 2 == 0).then_some(())?;
        char::decode_utf16(units16(bytes, big))
            .collect::<Result<String, _>>()
            .ok()
    };
    let utf32 = |bytes: &[u8], big: bool| -> Option<String> {
        (bytes.len() % 4 == 0).then_some(())?;
        let unit = |q: &[u8]| {
            let q = [q[0], q[1], q[2], q[3]];
            char::from_u32(match big {
                true => u32::from_be_bytes(q),
                false => u32::from_le_bytes(q),
            })
        };
        bytes.chunks_exact(4).map(unit).collect()
    };
    let b = body;
    let text = if b.starts_with(b"\x00\x00\xfe\xff") {
        utf32(&b[4..], true)
    } else if b.starts_with(b"\xff\xfe\x00\x00") {
        utf32(&b[4..], false)
    } else if b.starts_with(b"\xfe\xff") {
        utf16(&b[2..], true)
    } else if b.starts_with(b"\xff\xfe") {
        utf16(&b[2..], false)
    } else if b.starts_with(b"\xef\xbb\xbf") {
        String::from_utf8(b[3..].to_vec()).ok()
    } else if b.len() >= 4 && b[0] == 0 {
        match b[1] {
            0 => utf32(b, true),
            _ => utf16(b, true),
        }
    } else if b.len() >= 4 && b[1] == 0 {
        match b[2] != 0 || b[3] != 0 {
            true => utf16(b, false),
            false => utf32(b, false),
        }
    } else if b.len() == 2 && (b[0] == 0 || b[1] == 0) {
        utf16(b, b[0] == 0)
    } else {
        String::from_utf8(b.to_vec()).ok()
    };
    match text.map(|t| serde_json::from_str::<Raw>(&t)) {
        Some(Ok(value)) => exact(&value, path),
        _ => Reading::Refuses,
    }
}

/// A change to the filter's reading: none, or a planted bug.
type Plant = fn(BodyRead) -> BodyRead;

/// What the filter makes of `body` fed in two pieces cut at `cut`, with `plant` applied.
fn filter_reads(
    body: &[u8],
    cut: usize,
    path: &[&str],
    plant: Plant,
) -> Result<Option<String>, Problem> {
    let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
    let mut reader = UsageReader::of_request(Vec::new(), vec![path]);
    let (a, b) = body.split_at(cut.min(body.len()));
    reader.feed(a);
    reader.feed(b);
    reader.finish();
    body_value(reader.text(0), plant(BodyRead::of(&reader, true)))
}

/// The invariant against one reference's reading.
fn agrees(filter: &Result<Option<String>, Problem>, reference: &Reading) -> bool {
    let Ok(value) = filter else {
        return true;
    };
    match reference {
        Reading::Refuses => true,
        Reading::Absent => value.is_none(),
        Reading::Str(s) => *value == key_safe(s.as_bytes()).map(Cow::into_owned),
        Reading::Other => false,
    }
}

/// A key Go takes for `segment`: each letter as it is, in the other case or as a character
/// beyond ASCII that folds to it, each character raw or as a `\u` escape; sometimes
/// another key altogether.
fn key_for(segment: &'static str) -> impl Strategy<Value = String> {
    let chars: Vec<BoxedStrategy<String>> = segment
        .chars()
        .map(|c| {
            let mut forms = vec![c, c.to_ascii_uppercase()];
            forms.extend(match c {
                'k' => &['\u{212a}'][..],
                's' => &['\u{17f}'][..],
                'i' => &['\u{130}', '\u{131}'][..],
                _ => &[][..],
            });
            let forms = forms.clone();
            (0..forms.len(), 0..4u8)
                .prop_map(move |(at, escaped)| {
                    let c = forms[at];
                    match escaped {
                        0 => format!("\\u{:04x}", u32::from(c)),
                        _ => c.to_string(),
                    }
                })
                .boxed()
        })
        .collect();
    prop_oneof![
        4 => chars.prop_map(|parts| parts.concat()),
        1 => prop::sample::select(vec!["other", "messages", "x"]).prop_map(str::to_string),
    ]
}

/// A JSON value to put at a key, `inner` being an object of more keys.
fn value(inner: BoxedStrategy<String>) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["gpt-4o", "gpt-3.5", "", "a b", "x\\u002dy"])
            .prop_map(|s| format!("\"{s}\"")),
        1 => Just("null".to_string()),
        1 => prop::sample::select(vec!["4", "true", "[\"gpt-4o\"]"]).prop_map(str::to_string),
        2 => inner,
    ]
}

fn object(
    keys: BoxedStrategy<String>,
    values: BoxedStrategy<String>,
) -> impl Strategy<Value = String> {
    prop::collection::vec((keys, values), 0..4).prop_map(|members| {
        let members: Vec<String> = members
            .into_iter()
            .map(|(k, v)| format!("\"{k}\": {v}"))
            .collect();
        format!("{{{}}}", members.join(", "))
    })
}

/// A body holding `path` (one or two segments) in ways parsers read differently, in one of
/// the encodings a Python reader detects.
fn body(path: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let leaf = value(Just("{}".to_string()).boxed()).boxed();
    let text = match path {
        [only] => object(key_for(only).boxed(), leaf).boxed(),
        [outer, inner, ..] => {
            let inner = object(key_for(inner).boxed(), leaf).boxed();
            object(key_for(outer).boxed(), value(inner).boxed()).boxed()
        }
        [] => Just("{}".to_string()).boxed(),
    };
    (text, 0..8u8).prop_map(|(text, encoding)| match encoding {
        0 => [&b"\xef\xbb\xbf"[..], text.as_bytes()].concat(),
        1 => [vec![0xff, 0xfe], utf16(&text, false)].concat(),
        2 => [vec![0xfe, 0xff], utf16(&text, true)].concat(),
        3 => utf16(&text, false),
        4 => [&b"\xff\xfe\x00\x00"[..], &utf32le(&text)].concat(),
        5 => format!(" {text}\n").into_bytes(),
        _ => text.into_bytes(),
    })
}

fn utf16(text: &str, big: bool) -> Vec<u8> {
    let unit = |u: u16| match big {
        true => u.to_be_bytes(),
        false => u.to_le_bytes(),
    };
    text.encode_utf16().flat_map(unit).collect()
}

fn utf32le(text: &str) -> Vec<u8> {
    text.chars()
        .flat_map(|c| u32::from(c).to_le_bytes())
        .collect()
}

/// Runs the property over `cases` bodies from a fixed seed with `plant` applied to the
/// filter's reading: the first body on which the filter disagrees with a reference, if any.
fn differential(cases: u32, path: &'static [&'static str], plant: Plant) -> Result<(), String> {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&(body(path), any::<usize>()), |(body, cut)| {
        let filter = filter_reads(&body, cut % (body.len() + 1), path, plant);
        let references = [
            ("python", python_reads(&body, path)),
            ("go", go_reads(&body, path)),
            ("serde_json", serde_reads(&body, path)),
        ];
        for (name, reading) in references {
            if !agrees(&filter, &reading) {
                return Err(TestCaseError::fail(format!(
                    "{} reads {reading:?}, the filter {filter:?}",
                    name
                )));
            }
        }
        Ok(())
    });
    result.map_err(|failure| failure.to_string())
}

fn as_is(read: BodyRead) -> BodyRead {
    read
}

#[test]
fn the_identity_read_from_a_body_is_every_upstream_s_or_the_request_is_refused() {
    for path in [&["model"][..], &["metadata", "user_id"], &["max_tokens"]] {
        if let Err(failure) = differential(3000, path, as_is) {
            panic!("{path:?}: {failure}");
        }
    }
}

#[test]
fn a_reading_that_forgets_keys_in_another_case_is_caught() {
    fn forgets_repeats(read: BodyRead) -> BodyRead {
        match read {
            BodyRead::Repeated => BodyRead::Json,
            other => other,
        }
    }
    let failure = differential(3000, &["model"], forgets_repeats).unwrap_err();
    assert!(failure.contains("go reads"), "{failure}");
}

#[test]
fn a_reading_that_takes_another_encoding_for_no_json_is_caught() {
    fn no_json(read: BodyRead) -> BodyRead {
        match read {
            BodyRead::Unreadable => BodyRead::NotJson,
            other => other,
        }
    }
    let failure = differential(3000, &["model"], no_json).unwrap_err();
    assert!(failure.contains("python reads"), "{failure}");
}

#[test]
fn keys_in_another_case_or_encoding_are_refused_and_the_plain_body_read() {
    let read = |body: &[u8]| filter_reads(body, 0, &["model"], as_is);
    let model = |s: &str| Ok(Some(s.to_string()));
    assert_eq!(read(br#"{"model": "gpt-4o"}"#), model("gpt-4o"));
    for ambiguous in [
        &br#"{"model": "gpt-3.5", "MODEL": "gpt-4o"}"#[..],
        br#"{"Model": "gpt-4o"}"#,
        br#"{"\u004dodel": "gpt-4o"}"#,
    ] {
        assert_eq!(read(ambiguous), Err(Problem::Repeated));
    }
    let utf16 = [&[0xff, 0xfe][..], &utf16(r#"{"model": "gpt-4o"}"#, false)].concat();
    for foreign in [&b"\xef\xbb\xbf{\"model\": \"gpt-4o\"}"[..], &utf16] {
        assert_eq!(read(foreign), Err(Problem::BodyUnreadable));
    }
    assert_eq!(read(b"model=gpt-4o"), Ok(None), "a form holds no field");
}
