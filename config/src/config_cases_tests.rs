//! The parser's half of the agreement with the JSON Schema: `schema/cases.json` labels each
//! configuration `valid`, `invalid` or `parser-only`, and `testbed/tests/test_schema.py`
//! holds the schema to the same labels, so the two judges agree with each other. Here the
//! parser must accept the valid ones and refuse the others, at the field the case names;
//! and every object of the configuration must have the same fields in both, so that a field
//! added to the parser cannot be forgotten in the schema (or the other way round).

use super::Config;
use serde_json::Value;
use std::collections::BTreeSet;

const CORPUS: &str = include_str!("../../schema/cases.json");
const SCHEMA: &str = include_str!("../../schema/ratelimit.schema.json");

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

/// The fields the parser knows where `config` has its unknown field `zz`, read from the
/// parser's own error ("unknown field `zz`, expected one of `a`, `b`").
fn parser_fields(config: &str) -> BTreeSet<String> {
    let e = Config::parse(config.as_bytes()).expect_err("an unknown field is refused");
    let (_, expected) = e
        .problem
        .split_once("expected")
        .unwrap_or_else(|| panic!("not an unknown-field error: {e}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_parser_and_the_schema_know_the_same_fields_everywhere() {
    let schema: Value = serde_json::from_str(SCHEMA).expect("the schema is JSON");
    // An unknown field is refused the moment it is read, before anything else is checked.
    let places = [
        ("the top level", "/properties", r#"{"zz": 1}"#),
        (
            "backend",
            "/definitions/backend/properties",
            r#"{"backend": {"zz": 1}}"#,
        ),
        (
            "backend.redis",
            "/definitions/redis/properties",
            r#"{"backend": {"redis": {"zz": 1}}}"#,
        ),
        (
            "headers",
            "/properties/headers/properties",
            r#"{"headers": {"zz": 1}}"#,
        ),
        (
            "circuit_breaker",
            "/properties/circuit_breaker/properties",
            r#"{"circuit_breaker": {"zz": 1}}"#,
        ),
        (
            "an identity",
            "/definitions/identity/properties",
            r#"{"identity": {"u": {"zz": 1}}}"#,
        ),
        (
            "a jwt",
            "/definitions/jwt/properties",
            r#"{"identity": {"u": {"jwt": {"zz": 1}}}}"#,
        ),
        (
            "a rule",
            "/definitions/rule/properties",
            r#"{"rules": [{"zz": 1}]}"#,
        ),
        (
            "a match",
            "/definitions/match/properties",
            r#"{"rules": [{"match": {"zz": 1}}]}"#,
        ),
        (
            // Every field in each of its forms (a bucket, a calendar quota): the first's.
            "a limit",
            "/definitions/limit/oneOf/0/properties",
            r#"{"rules": [{"limit": {"zz": 1}}]}"#,
        ),
        (
            "a block",
            "/definitions/block/properties",
            r#"{"rules": [{"block": {"zz": 1}}]}"#,
        ),
        (
            "a meter",
            "/definitions/meter/properties",
            r#"{"rules": [{"meter": {"zz": 1}}]}"#,
        ),
        (
            "a lease",
            "/definitions/lease/properties",
            r#"{"rules": [{"lease": {"zz": 1}}]}"#,
        ),
        (
            "a rule's global",
            "/definitions/global/properties",
            r#"{"rules": [{"global": {"zz": 1}}]}"#,
        ),
        (
            "a rule's in_flight",
            "/definitions/in_flight/properties",
            r#"{"rules": [{"in_flight": {"zz": 1}}]}"#,
        ),
    ];
    let mut wrong = Vec::new();
    for (place, pointer, config) in places {
        let parser = parser_fields(config);
        let in_schema: BTreeSet<String> = schema
            .pointer(pointer)
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("the schema has no {pointer}"))
            .keys()
            .cloned()
            .collect();
        if parser != in_schema {
            wrong.push(format!(
                "{place}: fields only the parser knows: {:?}; only the schema ({pointer}): {:?}",
                parser.difference(&in_schema).collect::<Vec<_>>(),
                in_schema.difference(&parser).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the parser and schema/ratelimit.schema.json disagree on fields (add the field to the \
         schema and cases to schema/cases.json):\n{}",
        wrong.join("\n")
    );
}
