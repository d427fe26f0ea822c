//! What the scanner makes of one JSON value: which numbers are counts, which poison,
//! which are not there; structure followed through strings, escapes, arrays and depth;
//! malformed JSON. Every body here is also read cut at every byte (`tests::read`).

use crate::metering::tests::json;

const PROMPT: &[&str] = &["usage.prompt_tokens"];

fn prompt(body: &str) -> (Option<u64>, bool) {
    let (values, poisoned) = json(PROMPT, body);
    (values.first().copied().flatten(), poisoned)
}

#[test]
fn a_count_is_recorded_at_its_path_and_nowhere_else() {
    let body = r#"{"prompt_tokens": 1, "usage": {"total": 2, "prompt_tokens": 3,
                   "x": {"prompt_tokens": 4}}, "other": {"usage": {"prompt_tokens": 5}}}"#;
    assert_eq!(prompt(body), (Some(3), false));
    assert_eq!(prompt(r#"{"usage": {}}"#), (None, false));
    assert_eq!(prompt("{}"), (None, false));
}

#[test]
fn zero_minus_zero_and_two_to_the_53_are_counts() {
    assert_eq!(prompt(r#"{"usage":{"prompt_tokens":0}}"#), (Some(0), false));
    assert_eq!(
        prompt(r#"{"usage":{"prompt_tokens":-0}}"#),
        (Some(0), false)
    );
    let max = r#"{"usage":{"prompt_tokens":9007199254740992}}"#;
    assert_eq!(prompt(max), (Some(1 << 53), false));
}

#[test]
fn every_value_other_than_a_count_or_null_at_a_path_poisons() {
    let values = [
        "-1",
        "-12",
        "1.5",
        "1.0",
        "0.0",
        "-0.0",
        "1e3",
        "1E3",
        "1e+3",
        "0e0",
        "9007199254740993",
        "1000000000000000000000000000000",
        "18446744073709551616",
        r#""12""#,
        r#""""#,
        "true",
        "false",
        "{}",
        r#"{"prompt_tokens":1}"#,
        "[]",
        "[1]",
    ];
    for value in values {
        let body = format!(r#"{{"usage":{{"prompt_tokens":{value}}}}}"#);
        assert_eq!(prompt(&body), (None, true), "{value}");
    }
}

#[test]
fn a_poison_stays_and_a_count_before_it_stands() {
    let body = r#"{"usage":{"prompt_tokens":5,"prompt_tokens":"x","prompt_tokens":6}}"#;
    assert_eq!(prompt(body), (Some(6), true));
}

#[test]
fn null_at_a_path_or_above_it_is_ignored_without_poison() {
    assert_eq!(prompt(r#"{"usage":null}"#), (None, false));
    assert_eq!(prompt(r#"{"usage":{"prompt_tokens":null}}"#), (None, false));
    let later = r#"{"usage":{"prompt_tokens":4,"prompt_tokens":null}}"#;
    assert_eq!(
        prompt(later),
        (Some(4), false),
        "null does not erase a count"
    );
}

#[test]
fn a_path_cut_short_by_a_non_object_is_not_there_and_does_not_poison() {
    for usage in [
        "5",
        "-1.5",
        r#""text""#,
        "true",
        "null",
        "[]",
        r#"[{"prompt_tokens":"x"}]"#,
    ] {
        let body = format!(r#"{{"usage":{usage}}}"#);
        assert_eq!(prompt(&body), (None, false), "{usage}");
    }
}

#[test]
fn a_root_that_is_not_an_object_holds_no_path() {
    for body in [
        "7",
        r#""usage""#,
        "null",
        r#"[{"usage":{"prompt_tokens":1}}]"#,
    ] {
        assert_eq!(prompt(body), (None, false), "{body}");
    }
}

#[test]
fn array_elements_never_match_but_what_follows_the_array_does() {
    let body = r#"{"choices":[{"usage":{"prompt_tokens":9}},[{"usage":"x"}],"]"],
                  "usage":{"list":[1,{"prompt_tokens":8}],"prompt_tokens":1}}"#;
    assert_eq!(prompt(body), (Some(1), false));
}

#[test]
fn the_last_of_duplicated_keys_wins_at_every_level() {
    let body = r#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"prompt_tokens":3}}"#;
    assert_eq!(prompt(body), (Some(3), false));
    let later_object = r#"{"usage":{"prompt_tokens":1},"usage":{}}"#;
    assert_eq!(
        prompt(later_object),
        (Some(1), false),
        "an empty repeat erases nothing"
    );
}

#[test]
fn keys_that_only_begin_or_end_like_a_segment_do_not_match() {
    let body = r#"{"usage_x":{"prompt_tokens":1},"usag":{"prompt_tokens":2},
                   "Usage":{"prompt_tokens":3},"xusage":{"prompt_tokens":4},
                   "usage":{"prompt_tokens2":5,"prompt_token":6,"prompt_tokens ":7}}"#;
    assert_eq!(prompt(body), (None, false));
}

#[test]
fn several_paths_share_a_prefix_and_each_gets_its_own_value() {
    let list = &[
        "usage.prompt_tokens",
        "usage.completion_tokens",
        "usage",
        "id",
    ];
    let body = r#"{"id":"x","usage":{"completion_tokens":2,"prompt_tokens":1}}"#;
    // `usage` itself is an object there, and `id` a string: both poison.
    assert_eq!(json(list, body), (vec![Some(1), Some(2), None, None], true));
    let same_twice = &["usage.prompt_tokens", "usage.prompt_tokens"];
    assert_eq!(
        json(same_twice, r#"{"usage":{"prompt_tokens":4}}"#),
        (vec![Some(4), Some(4)], false)
    );
}

#[test]
fn quotes_backslashes_and_brackets_inside_strings_do_not_move_the_structure() {
    let body = r#"{"a":"}\"{[\\","b\"}":"\\\\\"","\\":["]}"],"usage":{"x":"\"prompt_tokens\":9,",
                  "prompt_tokens":4}}"#;
    assert_eq!(prompt(body), (Some(4), false));
}

#[test]
fn escaped_keys_match_when_each_escape_decodes_to_one_byte() {
    let body = r#"{"\u0075sage":{"prompt\u005Ftokens":11}}"#;
    assert_eq!(prompt(body), (Some(11), false));
    let slash = json(&["a/b.c"], r#"{"a\/b":{"c":12}}"#);
    assert_eq!(slash, (vec![Some(12)], false));
    let quote = json(&["we\"ird.tab\t"], r#"{"we\"ird":{"tab\t":13}}"#);
    assert_eq!(quote, (vec![Some(13)], false));
}

#[test]
fn a_key_with_a_non_ascii_escape_matches_as_decoded_as_the_same_key_unescaped_does() {
    let list = &["caf\u{e9}.n"];
    let escaped = json(list, r#"{"caf\u00e9":{"n":1}}"#);
    assert_eq!(escaped, (vec![Some(1)], false));
    let raw = json(list, "{\"caf\u{e9}\":{\"n\":2}}");
    assert_eq!(raw, (vec![Some(2)], false));
}

#[test]
fn a_key_of_64_bytes_matches_and_a_longer_one_never_does() {
    let long = "k".repeat(64);
    let body = format!(r#"{{"{long}":1,"{long}k":2}}"#);
    assert_eq!(json(&[long.as_str()], &body), (vec![Some(1)], false));
    let longer = format!("{long}k");
    assert_eq!(json(&[longer.as_str()], &body), (vec![None], false));
}

#[test]
fn a_path_of_eight_segments_is_found_eight_objects_down() {
    let list = &["a.b.c.d.e.f.g.h"];
    let body = r#"{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":21}}}}}}}}"#;
    assert_eq!(json(list, body), (vec![Some(21)], false));
}

#[test]
fn objects_nested_past_the_depth_limit_are_skipped_and_the_usage_after_them_is_read() {
    let deep = format!("{}1{}", r#"{"a":["#.repeat(40), "]}".repeat(40));
    let body = format!(r#"{{"x":{deep},"usage":{{"prompt_tokens":3}}}}"#);
    assert_eq!(prompt(&body), (Some(3), false));
    let strings = format!("{}\"]}}\\\"\"{}", "[".repeat(40), "]".repeat(40));
    let body = format!(r#"{{"x":{strings},"usage":{{"prompt_tokens":4}}}}"#);
    assert_eq!(prompt(&body), (Some(4), false));
}

#[test]
fn whitespace_of_every_kind_is_allowed_around_every_token() {
    let body = " \t\r\n{ \"usage\"\n:\r{\t\"prompt_tokens\" : 17 \n}\r\n}\n\t ";
    assert_eq!(prompt(body), (Some(17), false));
}

#[test]
fn malformed_json_stops_the_reading_and_what_was_recorded_stands() {
    let list = &["usage.prompt_tokens", "usage.completion_tokens"];
    let cases = [
        r#"{"usage":{"prompt_tokens":3 "completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3,,"completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3,"completion_tokens" 4}}"#,
        r#"{"usage":{"prompt_tokens":3,completion_tokens:4}}"#,
        r#"{"usage":{"prompt_tokens":3]"completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3,"x":tru,"completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3,"x":"\q","completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3,"x":"\u12G4","completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3}} {"usage":{"completion_tokens":4}}"#,
        r#"{"usage":{"prompt_tokens":3}}}{"usage":{"completion_tokens":4}}"#,
    ];
    for body in cases {
        assert_eq!(json(list, body), (vec![Some(3), None], false), "{body}");
    }
}

#[test]
fn a_number_outside_the_grammar_is_malformed_not_a_count_nor_a_poison() {
    for value in [
        "01", "-", "-a", "1.", "1.e3", ".5", "1e", "1e+", "+1", "0x1", "1-2", "--1",
    ] {
        let body = format!(r#"{{"usage":{{"prompt_tokens":{value}}}}}"#);
        assert_eq!(prompt(&body), (None, false), "{value}");
    }
}

#[test]
fn trailing_commas_and_mismatched_brackets_are_malformed() {
    for body in [
        r#"{"usage":{"completion_tokens":1,},"usage":{"prompt_tokens":1}}"#,
        r#"{"a":1,,"usage":{"prompt_tokens":1}}"#,
        r#"{"a":[1},"usage":{"prompt_tokens":1}}"#,
        r#"{"a":{"b":1],"usage":{"prompt_tokens":1}}"#,
        r#"{"a":[[{}],{[]}}],"usage":{"prompt_tokens":1}}"#,
        r#"{"a"],"usage":{"prompt_tokens":1}}"#,
    ] {
        assert_eq!(prompt(body), (None, false), "{body}");
    }
}

#[test]
fn a_container_no_path_leads_into_is_held_to_the_grammar_as_a_strict_parser_holds_it() {
    // A client's parser refuses the whole value: a count after the flaw is not read.
    for body in [
        r#"{"a":[1,],"usage":{"prompt_tokens":7}}"#,
        r#"{"a":{"b":1,},"usage":{"prompt_tokens":7}}"#,
        r#"{"a":[,1],"usage":{"prompt_tokens":7}}"#,
        r#"{"a":[1 2],"usage":{"prompt_tokens":7}}"#,
        r#"{"a":{"b" 1},"usage":{"prompt_tokens":7}}"#,
        r#"{"a":[tru],"usage":{"prompt_tokens":7}}"#,
        "{\"a\":[\"x\u{0}y\"],\"usage\":{\"prompt_tokens\":7}}",
        "{\"a\":{\"k\u{1f}\":1},\"usage\":{\"prompt_tokens\":7}}",
        "{\"a\":\"line\nbreak\",\"usage\":{\"prompt_tokens\":7}}",
    ] {
        assert_eq!(prompt(body), (None, false), "{body:?}");
    }
    // A quoted bracket ends nothing, and what such a container says never counts,
    // however it looks like a path's value.
    for body in [
        r#"{"a":[{"usage":{"prompt_tokens":1}}],"usage":{"prompt_tokens":7}}"#,
        r#"{"a":{"x]}\"[":[{"y":"}"}]},"usage":{"prompt_tokens":7}}"#,
        "{\"a\":\"\u{7f}\u{20}\",\"usage\":{\"prompt_tokens\":7}}",
    ] {
        assert_eq!(prompt(body), (Some(7), false), "{body:?}");
    }
    assert_eq!(
        prompt(r#"{"choices":[{"usage":{"prompt_tokens":9}}]}"#),
        (None, false)
    );
}

#[test]
fn below_the_deepest_followed_level_only_brackets_and_strings_are_followed() {
    let deep = |inner: &str| {
        let (open, close) = ("[".repeat(40), "]".repeat(40));
        format!(r#"{{"a":{open}{inner}{close},"usage":{{"prompt_tokens":7}}}}"#)
    };
    assert_eq!(prompt(&deep(r#"1,"]",{"b":2}"#)), (Some(7), false));
    assert_eq!(
        prompt(&deep("\"\u{0}\"")),
        (None, false),
        "a control character"
    );
    assert_eq!(prompt(&deep("}")), (None, false), "a mismatched bracket");
}

#[test]
fn a_number_ending_the_body_counts_only_once_the_body_is_finished() {
    use crate::metering::{BodyFormat, UsageReader};
    let mut reader = UsageReader::new(BodyFormat::Json, crate::metering::tests::paths(PROMPT));
    reader.feed(br#"{"usage":{"prompt_tokens":12"#);
    assert_eq!(reader.values(), [None], "12 may go on: 123");
    reader.finish();
    assert_eq!(reader.values(), [Some(12)]);
    reader.finish();
    assert_eq!(reader.values(), [Some(12)]);
    assert!(!reader.poisoned());
}
