use crate::fakes::aws_message as message;
use crate::metering::tests::paths;
use crate::metering::{BodyFormat, UsageReader};

/// A ConverseStream response: its events, the usage in `metadata` (the last).
fn converse_stream() -> Vec<u8> {
    [
        message("messageStart", r#"{"role":"assistant"}"#),
        message(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"{\"usage\":{\"inputTokens\":1}}"}}"#,
        ),
        message("contentBlockStop", r#"{"contentBlockIndex":0}"#),
        message("messageStop", r#"{"stopReason":"end_turn"}"#),
        message(
            "metadata",
            r#"{"usage":{"inputTokens":30,"outputTokens":628,"totalTokens":658},"metrics":{"latencyMs":12}}"#,
        ),
    ]
    .concat()
}

const USAGE: [&str; 2] = ["usage.inputTokens", "usage.outputTokens"];

fn read(pieces: &[&[u8]]) -> (bool, Vec<Option<u64>>) {
    let mut r = UsageReader::new(BodyFormat::AwsEventStream, paths(&USAGE));
    for piece in pieces {
        r.feed(piece);
    }
    r.finish();
    (r.trusted(), r.values().to_vec())
}

#[test]
fn a_converse_stream_gives_its_metadata_s_usage_cut_anywhere() {
    let body = converse_stream();
    let expected = (true, vec![Some(30), Some(628)]);
    for at in 0..=body.len() {
        assert_eq!(read(&[&body[..at], &body[at..]]), expected, "cut at {at}");
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(read(&bytes), expected);
}

#[test]
fn a_stream_cut_inside_a_message_of_an_impossible_length_or_a_failed_crc_is_distrusted() {
    let body = converse_stream();
    for at in [1, 11, 12, 30, body.len() - 1] {
        assert!(!read(&[&body[..at]]).0, "cut at {at}");
    }
    let mut liar = converse_stream();
    liar[..4].copy_from_slice(&3u32.to_be_bytes()); // shorter than a prelude and a CRC
    assert_eq!(read(&[&liar]), (false, vec![None, None]));
    let mut huge = converse_stream();
    huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(!read(&[&huge]).0);
    let mut headers_past_the_end = converse_stream();
    headers_past_the_end[4..8].copy_from_slice(&1000u32.to_be_bytes());
    assert!(!read(&[&headers_past_the_end]).0);
    // A byte changed in the last message's payload, a CRC is then wrong: its own, or the
    // prelude's; the counts it held are not to be trusted, as an SDK would not read them.
    let body = converse_stream();
    let at = body.len() - 20;
    for (i, what) in [(at, "payload"), (body.len() - 1, "message CRC")] {
        let mut bent = body.clone();
        bent[i] ^= 1;
        assert!(!read(&[&bent]).0, "{what}");
    }
    let last = body.len() - message("metadata", "").len();
    let mut bent = body.clone();
    bent[last + 9] ^= 1; // the metadata message's prelude CRC (it is longer than that)
    assert!(!read(&[&bent]).0, "prelude CRC");
}

#[test]
fn a_message_without_headers_or_payload_and_a_malformed_payload_are_framed_on() {
    let mut empty = vec![0, 0, 0, 16, 0, 0, 0, 0];
    empty.extend(crc32fast::hash(&empty).to_be_bytes());
    empty.extend(crc32fast::hash(&empty).to_be_bytes());
    empty.extend(message("metadata", r#"{"usage":{"inputTokens":5,,}}"#));
    empty.extend(message(
        "metadata",
        r#"{"usage":{"inputTokens":7,"outputTokens":2}}"#,
    ));
    let (trusted, values) = read(&[&empty]);
    assert_eq!(values, [Some(7), Some(2)]);
    assert!(
        !trusted,
        "a payload malformed after a value on a path began"
    );
}
