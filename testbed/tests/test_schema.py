"""The JSON Schema's half of the agreement with the filter's parser.

schema/ratelimit.schema.json is what Kong validates a filter configuration with
(`config_schema` in dist/kong/ratelimit.meta.json) and what editors can check a
configuration against; it is only worth having if it says what the parser says. Both judge
the same corpus, schema/cases.json: the parser in config/src/config_cases_tests.rs, the
schema here, each against the corpus's labels, so they agree with each other. A case the
schema cannot judge is labelled `parser-only` and must stay accepted by the schema (if the
schema learns to refuse it, relabel it `invalid`)."""

import json
from pathlib import Path

from jsonschema import Draft4Validator

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = json.loads((ROOT / "schema" / "ratelimit.schema.json").read_text())
CASES = json.loads((ROOT / "schema" / "cases.json").read_text())["cases"]


def schema_errors(config):
    """The schema's complaints about `config`, one line each (empty: it is valid)."""
    validator = Draft4Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in validator.iter_errors(config)]


def test_the_schema_is_draft_4_as_kong_requires():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-04/schema#"
    Draft4Validator.check_schema(SCHEMA)


def test_the_schema_gives_every_case_its_label():
    wrong = []
    for case in CASES:
        errors = schema_errors(case["config"])
        label = case["expect"]
        if label == "valid" and errors:
            wrong.append(f"case {case['name']!r} is labelled valid, but the schema refuses it: "
                         + "; ".join(errors))
        elif label == "invalid" and not errors:
            wrong.append(f"case {case['name']!r} is labelled invalid (the parser refuses it at "
                         f"{case['field']!r}), but the schema accepts it")
        elif label == "parser-only" and errors:
            wrong.append(f"case {case['name']!r} is labelled parser-only, but the schema refuses "
                         "it too: relabel it invalid (" + "; ".join(errors) + ")")
        elif label not in ("valid", "invalid", "parser-only"):
            wrong.append(f"case {case['name']!r} has the unknown label {label!r}")
    assert not wrong, ("the schema disagrees with schema/cases.json (the parser is judged by "
                       "config/src/config_cases_tests.rs):\n" + "\n".join(wrong))


def test_every_case_has_a_unique_name_and_parser_only_cases_say_why():
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for case in CASES:
        assert case["expect"] == "valid" or case.get("field"), case["name"]
        assert case["expect"] != "parser-only" or case.get("why"), case["name"]


def walk(node, found):
    """Every property name and string enum value the schema holds."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties":
                found["properties"].update(value)
            if key == "enum":
                found["enums"].update(v for v in value if isinstance(v, str))
            walk(value, found)
    elif isinstance(node, list):
        for value in node:
            walk(value, found)
    return found


def used(cases):
    """The keys and string values that appear in the configurations of `cases`."""
    keys, values = set(), set()

    def visit(node):
        if isinstance(node, dict):
            keys.update(node)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)
        elif isinstance(node, str):
            values.add(node)

    for case in cases:
        visit(case["config"])
    return keys, values


def test_the_corpus_covers_every_field_and_every_enum_value():
    schema = walk(SCHEMA, {"properties": set(), "enums": set()})
    valid_keys, valid_values = used(c for c in CASES if c["expect"] == "valid")
    invalid_keys, _ = used(c for c in CASES if c["expect"] == "invalid")
    assert schema["properties"] - valid_keys == set(), "fields no valid case uses"
    assert schema["properties"] - invalid_keys == set(), "fields no invalid case uses"
    assert schema["enums"] - valid_values == set(), "enum values no valid case uses"
