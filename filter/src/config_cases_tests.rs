//! The parser's half of the agreement with the JSON Schema: `schema/cases.json` labels each
//! configuration `valid`, `invalid` or `parser-only`, and `testbed/tests/test_schema.py`
//! holds the schema to the same labels, so the two judges agree with each other. Here the
//! parser must accept the valid ones and refuse the others, at the field the case names.

use super::Config;
use serde_json::Value;

const CORPUS: &str = include_str!("../../schema/cases.json");

/// `reported` is `expected` or a field inside it (`rules[0].limit` covers
/// `rules[0].limit.per`), as in `config_tests`.
fn within(reported: &str, expected: &str) -> bool {
    reported == expected
        || reported.starts_with(&format!("{expected}."))
        || reported.starts_with(&format!("{expected}["))
}

/// What is wrong with the parser's verdict on one case, if anything.
fn disagreement(case: &Value) -> Option<String> {
    let name = case["name"].as_str().unwrap_or("<unnamed>");
    let expect = case["expect"].as_str().unwrap_or("<no label>");
    let json = serde_json::to_vec(&case["config"]).expect("a case is JSON");
    match (expect, Config::parse(&json)) {
        ("valid", Ok(_)) => None,
        ("valid", Err(e)) => Some(format!(
            "case {name:?} is labelled valid, but the parser refuses it: {e}"
        )),
        ("invalid" | "parser-only", Ok(_)) => Some(format!(
            "case {name:?} is labelled {expect}, but the parser accepts it"
        )),
        ("invalid" | "parser-only", Err(e)) => match case["field"].as_str() {
            Some(field) if !within(&e.field, field) => Some(format!(
                "case {name:?} is labelled {expect} at {field:?}, but the parser refuses it \
                 elsewhere: {e}"
            )),
            Some(_) => None,
            None => Some(format!("case {name:?} names no field")),
        },
        _ => Some(format!("case {name:?} has the unknown label {expect:?}")),
    }
}

#[test]
fn the_parser_gives_every_case_of_the_schema_corpus_its_label() {
    let corpus: Value = serde_json::from_str(CORPUS).expect("schema/cases.json is JSON");
    let cases = corpus["cases"].as_array().expect("a list of cases");
    let wrong: Vec<String> = cases.iter().filter_map(disagreement).collect();
    assert!(
        wrong.is_empty(),
        "the parser disagrees with schema/cases.json (the schema is judged by \
         testbed/tests/test_schema.py):\n{}",
        wrong.join("\n")
    );
    for label in ["valid", "invalid", "parser-only"] {
        assert!(
            cases.iter().filter(|c| c["expect"] == label).count() >= 10,
            "fewer than 10 {label} cases"
        );
    }
}
