"""The docs against the code.

The example configuration exists three times for three readers: the README (and again in
docs/configuration.md), the shipped envoy.yaml, and filter/example-config.json (the
filter's own tests load it). They must say the same thing; the filter's tests prove that one
is valid, this proves the others equal it.

deploy/ holds three more, for Kong, Istio and Higress. Every example must pass the JSON Schema, and
each is a case of schema/cases.json, which the parser judges too (a schema cannot see a
rule's key naming an unknown identity).

The docs name every counter the filter has."""

import json
import re
from pathlib import Path

import yaml
from jsonschema import Draft4Validator

from testbed.stack import default_plugin

ROOT = Path(__file__).resolve().parent.parent.parent
# The pages a reader is sent to, README first (its first example is the one shared with
# envoy.yaml and filter/example-config.json).
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def docs_plugin_configs():
    """Every plugin configuration shown in a ```json block of the README or docs/, with the
    page and block it comes from, the README's first."""
    configs = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", page.read_text(), re.S)]
        configs += [(f"{page.relative_to(ROOT)}, block {i}", b)
                    for i, b in enumerate(blocks) if "rules" in b]
    return configs


def deploy_examples():
    """The plugin configurations in deploy/, by file."""
    kong = yaml.safe_load((ROOT / "deploy" / "kong" / "kong.yaml").read_text())
    (kong_config,) = [f["config"] for s in kong["services"] for c in s["filter_chains"]
                      for f in c["filters"] if f["name"] == "ratelimit"]
    istio = yaml.safe_load_all((ROOT / "deploy" / "istio" / "wasmplugin.yaml").read_text())
    (istio_config,) = [d["spec"]["pluginConfig"] for d in istio if d["kind"] == "WasmPlugin"]
    higress = yaml.safe_load((ROOT / "deploy" / "higress" / "wasmplugin.yaml").read_text())
    return {"deploy/kong/kong.yaml": kong_config, "deploy/istio/wasmplugin.yaml": istio_config,
            "deploy/higress/wasmplugin.yaml": higress["spec"]["defaultConfig"]}


def test_the_readme_envoy_yaml_and_example_config_agree():
    example = json.loads((ROOT / "filter" / "example-config.json").read_text())
    plugin_blocks = docs_plugin_configs()
    assert plugin_blocks and plugin_blocks[0][0].startswith("README.md"), \
        "the README shows a plugin configuration"
    assert plugin_blocks[0][1] == example
    assert default_plugin() == example


def test_every_example_passes_the_schema():
    schema = json.loads((ROOT / "schema" / "ratelimit.schema.json").read_text())
    examples = {"filter/example-config.json":
                json.loads((ROOT / "filter" / "example-config.json").read_text()),
                "envoy.yaml": default_plugin(), **deploy_examples()}
    examples.update(docs_plugin_configs())
    validator = Draft4Validator(schema)
    refused = {name: [e.message for e in validator.iter_errors(config)]
               for name, config in examples.items()}
    assert {name: errors for name, errors in refused.items() if errors} == {}


def test_the_parser_judges_every_example_through_the_corpus():
    cases = {c["name"]: c for c in
             json.loads((ROOT / "schema" / "cases.json").read_text())["cases"]}
    example = json.loads((ROOT / "filter" / "example-config.json").read_text())
    assert cases["the README's example"]["config"] == example
    for name, config in deploy_examples().items():
        assert cases[name]["expect"] == "valid"
        assert cases[name]["config"] == config, f"schema/cases.json's copy of {name} is stale"


def test_the_docs_name_every_counter_the_filter_has_and_no_other():
    names = re.findall(r'=> "ratelimit\.([a-z0-9_]+)"', (ROOT / "filter/src/counters.rs").read_text())
    assert len(names) >= 10, names
    docs = "".join(p.read_text() for p in DOCS)
    for name in names:
        assert f"`{name}`" in docs, f"the docs never mention the counter {name}"
    # A Prometheus name in the docs or in envoy.yaml's comments is one Envoy really writes:
    # `ratelimit_<counter>` or `ratelimit_<per-rule counter>_rule`, no `envoy_wasmcustom_`.
    shown = docs + (ROOT / "envoy.yaml").read_text()
    assert "envoy_wasmcustom_" not in shown
    for name in set(re.findall(r"\bratelimit_([a-z0-9_]+?)(?:_rule)?\{", shown)):
        assert name in names, f"the docs show ratelimit_{name}, which the filter does not count"

