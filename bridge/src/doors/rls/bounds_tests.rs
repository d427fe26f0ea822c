use super::*;

fn nested(depth: usize) -> String {
    format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

/// A domain's descriptors nested `depth` deep, block style, as envoyproxy/ratelimit's
/// examples write them.
fn block(depth: usize) -> String {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for level in 0..depth {
        let pad = "    ".repeat(level);
        text.push_str(&format!(
            "{pad}  - key: k{level}   # a comment ] ]\n{pad}    value: 'it''s ]]'\n\
             {pad}    rate_limit: {{unit: second, requests_per_unit: 5}}\n\
             {pad}    descriptors:\n"
        ));
    }
    text
}

#[test]
fn configurations_as_written_pass() {
    for text in [
        block(16),
        "domain: d\ndescriptors: []\n".to_owned(),
        // JSON is YAML: a flow document spread over lines, strings holding brackets.
        r#"{"domain": "d", "descriptors": [{"key": "k", "value": "[{", "descriptors": [
              {"key": "a", "rate_limit": {"unit": "second", "requests_per_unit": 1}}]}]}"#
            .to_owned(),
        "domain: d\ndescriptors:\n- key: a\n  value: >\n    [[[[ folded [[[\n    [[[[\n".to_owned(),
        "domain: d # ]]]] [[[[\ndescriptors:\n  - key: \"a\\\"[[\"\n".to_owned(),
        nested(MAX_NESTING - 1),
    ] {
        assert_eq!(check(&text), Ok(()), "{text}");
    }
}

#[test]
fn deep_nesting_is_refused_before_parsing_naming_the_line() {
    let error = check(&nested(MAX_NESTING + 1)).unwrap_err();
    assert!(error.starts_with("line 2: flow collections"), "{error}");
    // The reviewer's file: 160 kB of brackets (the parser took 21 s to refuse it).
    let hostile = nested(80_000);
    assert!(check(&hostile).is_err());
    let mut deep = String::from("a:\n");
    for level in 1..=MAX_NESTING + 1 {
        deep.push_str(&format!("{}k{level}:\n", " ".repeat(level)));
    }
    let error = check(&deep).unwrap_err();
    assert!(error.contains("block collections"), "{error}");
    let compact = format!("a:\n{}x\n", "- ".repeat(MAX_NESTING + 1));
    assert!(check(&compact).is_err());
}

/// Text that one reading takes for a string or a comment and the parser does not must not
/// hide the parser's brackets: every way to close levels the parser keeps open is tried.
#[test]
fn no_quote_comment_or_scalar_hides_the_parsers_nesting() {
    let deep = "[".repeat(MAX_NESTING + 1);
    let closers = "]".repeat(MAX_NESTING + 1);
    let tricks = [
        // An apostrophe inside a plain scalar opens no string.
        format!("a: x '\nb: {deep}\nc: '\n"),
        // A continuation line of a plain scalar starting with a quote.
        format!("a: x\n  'y\nb: {deep}\nc: '\n"),
        // `#` inside a plain scalar is no comment; closers there are literal.
        format!("a: {deep}x#{closers}\n"),
        // Closers inside strings, in a flow, between the levels.
        format!("a: {}\n", "[ \"]]\" ".repeat(MAX_NESTING + 1)),
        format!("a: {}\n", "[ ']]' ".repeat(MAX_NESTING + 1)),
        // Closers in comments, line after line.
        format!("a: {}\n", "[ # ]]\n".repeat(MAX_NESTING + 1)),
        // An escaped quote does not end a string.
        format!("a: {deep} \"\\\"{closers}\"\n"),
        // A doubled quote does not end a string.
        format!("a: {deep} '''{closers}'\n"),
        // A block scalar's end depends on indentation the scan does not track.
        format!("a: |\n  x\nb: {deep}\n"),
        // Lines broken by the breaks libyaml also takes.
        format!("a: x #c\u{85}b: {deep}\n"),
        format!("a: x #c\u{2028}b: {deep}\n"),
        format!("a: x #c\rb: {deep}\n"),
        // Anchors and tags end at a flow indicator.
        format!("a: &x{deep}\n"),
    ];
    for text in tricks {
        assert!(check(&text).is_err(), "{text:?}");
    }
}

#[test]
fn a_text_past_the_size_bound_is_refused() {
    let big = format!("domain: d\n#{}\n", "x".repeat(MAX_BYTES));
    assert!(check(&big).unwrap_err().contains("bytes, more than"));
}
