//! Server-sent events framing: line endings, fields, comments, multi-line data, the byte
//! order mark, and each event's data read as a value of its own. Every stream here is
//! also read cut at every byte (`tests::read`).

use crate::metering::tests::{events, paths};
use crate::metering::{BodyFormat, UsageReader};

const PROMPT: &[&str] = &["usage.prompt_tokens"];

fn prompt(body: &str) -> (Option<u64>, bool) {
    let (values, poisoned) = events(PROMPT, body);
    (values.first().copied().flatten(), poisoned)
}

#[test]
fn each_event_is_a_value_of_its_own_and_the_last_count_wins() {
    let body = "data: {\"usage\":{\"prompt_tokens\":1}}\n\n\
                data: {\"usage\":null}\n\n\
                data: {\"usage\":{\"prompt_tokens\":2}}\n\n";
    assert_eq!(prompt(body), (Some(2), false));
}

#[test]
fn crlf_and_cr_line_endings_frame_as_lf_does() {
    let lf = "event: a\ndata: {\"usage\":\ndata: {\"prompt_tokens\":5}}\n\ndata: [DONE]\n\n";
    assert_eq!(prompt(lf), (Some(5), false));
    assert_eq!(prompt(&lf.replace('\n', "\r\n")), (Some(5), false));
    assert_eq!(prompt(&lf.replace('\n', "\r")), (Some(5), false));
    let mixed = "data: {\"usage\":\r\ndata: {\"prompt_tokens\":6}}\r\r\ndata: {\"usage\":7}\n\r";
    assert_eq!(prompt(mixed), (Some(6), false));
}

#[test]
fn a_cr_then_lf_is_one_line_end_but_lf_then_cr_are_two() {
    // `\r\n` ends the data line only; the event goes on into its second data line.
    let one = "data: {\"usage\":\r\ndata: {\"prompt_tokens\":8}}\r\n\r\n";
    assert_eq!(prompt(one), (Some(8), false));
    // `\n\r`: the data line, then a blank line: the event ends before `{"prompt_tokens"`.
    let two = "data: {\"usage\":\n\rdata: {\"prompt_tokens\":9}}\n\n";
    assert_eq!(prompt(two), (None, false));
}

#[test]
fn data_lines_of_one_event_join_with_a_newline_which_ends_a_number() {
    let body = "data: {\"usage\":{\"prompt_tokens\":12\ndata: 34}}\n\n";
    // `12\n34` is 12, then junk: the event is malformed after 12.
    assert_eq!(prompt(body), (Some(12), false));
}

#[test]
fn comments_and_other_fields_are_ignored_however_they_look() {
    let ignored = [
        ": data: {\"usage\":{\"prompt_tokens\":1}}",
        ":",
        "event: data",
        "id: {\"usage\":{\"prompt_tokens\":2}}",
        "retry: 3",
        "datax: {\"usage\":{\"prompt_tokens\":4}}",
        "dat: {\"usage\":{\"prompt_tokens\":5}}",
        "Data: {\"usage\":{\"prompt_tokens\":6}}",
        " data: {\"usage\":{\"prompt_tokens\":7}}",
        "dat",
        "data",
    ];
    for line in ignored {
        assert_eq!(prompt(&format!("{line}\n\n")), (None, false), "{line}");
    }
    // Among an event's data lines, they add nothing (`data` alone adds a newline).
    let body = format!(
        "{}\ndata: {{\"usage\":{{\"prompt_tokens\":8}}}}\n\n",
        ignored.join("\n")
    );
    assert_eq!(prompt(&body), (Some(8), false));
}

#[test]
fn the_space_after_data_is_optional_and_more_spaces_are_json_whitespace() {
    for line in [
        "data:{\"usage\":{\"prompt_tokens\":1}}",
        "data: {\"usage\":{\"prompt_tokens\":1}}",
        "data:   {\"usage\":{\"prompt_tokens\":1}}  ",
        "data:\t{\"usage\":{\"prompt_tokens\":1}}",
    ] {
        assert_eq!(prompt(&format!("{line}\n\n")), (Some(1), false), "{line}");
    }
}

#[test]
fn a_malformed_event_is_ignored_to_its_end_and_the_next_starts_clean() {
    let body = "data: [DONE]\n\n\
                data: {\"usage\":{\"prompt_tokens\":1,\n\n\
                data: {\"usage\":{\"prompt_tokens\" 9}}\n\
                data: {\"usage\":{\"prompt_tokens\":10}}\n\n\
                data: {\"usage\":{\"prompt_tokens\":2}}\n\n\
                data: not json at all {\"usage\":{\"prompt_tokens\":3}}\n\n";
    assert_eq!(prompt(body), (Some(2), false));
}

#[test]
fn two_values_in_one_event_are_malformed_after_the_first() {
    let body = "data: {\"usage\":{\"prompt_tokens\":1}}\n\
                data: {\"usage\":{\"prompt_tokens\":2}}\n\n";
    assert_eq!(prompt(body), (Some(1), false));
}

#[test]
fn a_poison_in_one_event_outlives_the_event() {
    let body = "data: {\"usage\":{\"prompt_tokens\":1.5}}\n\n\
                data: {\"usage\":{\"prompt_tokens\":4}}\n\n";
    assert_eq!(prompt(body), (Some(4), true));
}

#[test]
fn a_leading_byte_order_mark_is_skipped_and_a_partial_one_spoils_only_its_line() {
    let body = "\u{feff}data: {\"usage\":{\"prompt_tokens\":3}}\n\n";
    assert_eq!(prompt(body), (Some(3), false));
    let mut partial = b"\xEF\xBBdata: {\"usage\":{\"prompt_tokens\":3}}\n".to_vec();
    partial.extend_from_slice(b"data: {\"usage\":{\"prompt_tokens\":4}}\n\n");
    let got =
        crate::metering::tests::read(crate::metering::BodyFormat::EventStream, PROMPT, &partial);
    assert_eq!(got, (vec![Some(4)], false));
    // Only at the stream's start: later, it is part of a line's field name.
    let later = "\n\u{feff}data: {\"usage\":{\"prompt_tokens\":3}}\n\n";
    assert_eq!(prompt(later), (None, false));
}

#[test]
fn an_event_cut_off_without_its_blank_line_keeps_what_it_recorded() {
    assert_eq!(
        prompt("data: {\"usage\":{\"prompt_tokens\":5}}"),
        (Some(5), false)
    );
    assert_eq!(
        prompt("data: {\"usage\":{\"prompt_tokens\":5,"),
        (Some(5), false)
    );
    // Pending at the very end, the number counts at `finish` (which `tests::read` calls).
    assert_eq!(
        prompt("data: {\"usage\":{\"prompt_tokens\":5"),
        (Some(5), false)
    );
}

#[test]
fn json_mode_bytes_are_not_events_and_events_are_not_json() {
    use crate::metering::tests::json;
    let stream = "data: {\"usage\":{\"prompt_tokens\":1}}\n\n";
    assert_eq!(json(PROMPT, stream), (vec![None], false));
    assert_eq!(
        prompt("{\"usage\":{\"prompt_tokens\":1}}\n\n"),
        (None, false)
    );
}

#[test]
fn an_event_passed_over_unread_is_one_where_no_path_can_have_a_value() {
    // Events of one line where every `"usage"` is a key whose value is null are passed
    // over unread; anything else that may hold one is read: an escaped key, a space before
    // the colon, a duplicate key, `null` cut short, a value on a later data line, a poison.
    let passed = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n";
    for (event, expected) in [
        (
            "data: {\"us\\u0061ge\":{\"prompt_tokens\":3}}\n\n",
            (Some(3), false),
        ),
        (
            "data: {\"usage\" :{\"prompt_tokens\":3}}\n\n",
            (Some(3), false),
        ),
        (
            "data: {\"usage\":null,\"usage\":{\"prompt_tokens\":3}}\n\n",
            (Some(3), false),
        ),
        (
            "data: {\"usage\":nul}\n\ndata: {\"usage\":{\"prompt_tokens\":3}}\n\n",
            (Some(3), false),
        ),
        (
            "data: {\"a\":1,\ndata: \"usage\":{\"prompt_tokens\":3}}\n\n",
            (Some(3), false),
        ),
        ("data: {\"usage\":{\"prompt_tokens\":-3}}\n\n", (None, true)),
    ] {
        let body = format!("{passed}{event}{passed}data: [DONE]\n\n");
        assert_eq!(prompt(&body), expected, "{event}");
    }
}

/// Whether `body` said it is done, fed whole, cut at every byte and a byte at a time.
fn done(body: &str) -> bool {
    let read = |pieces: &[&[u8]]| {
        let mut reader = UsageReader::new(BodyFormat::EventStream, paths(PROMPT));
        for piece in pieces {
            reader.feed(piece);
        }
        reader.done()
    };
    let whole = read(&[body.as_bytes()]);
    for at in 0..=body.len() {
        let (a, b) = body.as_bytes().split_at(at);
        assert_eq!(read(&[a, b]), whole, "cut at {at}");
    }
    let bytes: Vec<&[u8]> = body.as_bytes().chunks(1).collect();
    assert_eq!(read(&bytes), whole, "a byte at a time");
    whole
}

#[test]
fn a_stream_is_done_once_an_event_whose_data_is_done_ends() {
    let usage = "data: {\"usage\":{\"prompt_tokens\":1}}\n\n";
    assert!(done(&format!("{usage}data: [DONE]\n\n")));
    assert!(done(&format!("{usage}data:[DONE]\r\n\r\n")));
    assert!(done(&format!("{usage}event: end\ndata: [DONE]\n\n")));
    // Not yet: the event has not ended.
    assert!(!done(&format!("{usage}data: [DONE]\n")));
    // Not the data `[DONE]`: more, less, or another line joined to it.
    for other in [
        "data: [DONE] \n\n",
        "data: [DONE]x\n\n",
        "data: [DON\n\n",
        "data: \n\n",
        "data: [DONE]\ndata: x\n\n",
        "data\ndata: [DONE]\n\n",
        ": [DONE]\n\n",
        "done: [DONE]\n\n",
        "data: {\"x\":\"[DONE]\"}\n\n",
    ] {
        assert!(!done(&format!("{usage}{other}")), "{other:?}");
    }
}
