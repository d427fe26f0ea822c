"""The docs against the code.

The example configuration exists three times for three readers: the README (and again in
docs/configuration.md), the shipped envoy.yaml, and filter/example-config.json (the
filter's own tests load it). They must say the same thing; the filter's tests prove that one
is valid, this proves the others equal it.

deploy/ holds three more, for Kong, Istio and Higress. Every example must pass the JSON Schema, and
each is a case of schema/cases.json, which the parser judges too (a schema cannot see a
rule's key naming an unknown identity).

The docs name every counter the filter has; every relative link in them leads somewhere;
the request path of docs/architecture.md names only files, functions and types that exist;
and the README stays short enough to be read first."""

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
README_MAX_LINES = 220


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
    counters = (ROOT / "filter/src/decision/counters.rs").read_text()
    names = re.findall(r'=> "ratelimit\.([a-z0-9_]+)"', counters)
    assert len(names) >= 10, names
    docs = "".join(p.read_text() for p in DOCS)
    for name in names:
        assert f"`{name}`" in docs, f"the docs never mention the counter {name}"
    # A Prometheus name in the docs or in envoy.yaml's comments is one Envoy really writes:
    # `ratelimit_<counter>` or `ratelimit_<per-rule counter>_rule`, no `envoy_wasmcustom_`.
    shown = docs + (ROOT / "envoy.yaml").read_text()
    assert "envoy_wasmcustom_" not in shown
    # (The bridge's own metrics are `ratelimit_bridge_*`.)
    for name in set(re.findall(r"\bratelimit_(?!bridge_)([a-z0-9_]+?)(?:_rule)?\{", shown)):
        assert name in names, f"the docs show ratelimit_{name}, which the filter does not count"


# Pages other branches are adding at the same time (Redis Sentinel, monitoring): the README
# and docs/operations.md already link them. A link to one of these is tolerated while the
# page does not exist yet, and checked like any other once it does; no other missing page is.
PENDING_PAGES = {ROOT / "docs" / "sentinel.md", ROOT / "docs" / "monitoring.md"}


def prose(text):
    """`text` without its fenced code blocks, whose `#` lines are no headings and whose
    brackets are no links."""
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped (backticks
    included), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().rstrip("#").strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page):
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+)$", prose(page.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(page):
    """The targets of the page's Markdown links that are neither URLs nor mail."""
    text = re.sub(r"`[^`\n]*`", "code", prose(page.read_text()))
    targets = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_relative_link_in_the_docs_leads_to_a_file_and_heading_that_exist():
    broken = []
    for page in DOCS:
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if linked in PENDING_PAGES and not linked.exists():
                continue
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert broken == []


def test_the_link_checker_reads_anchors_as_github_makes_them():
    assert slug("Shadow mode (`mode`)") == "shadow-mode-mode"
    assert slug("The bridge's metrics") == "the-bridges-metrics"
    assert slug("Who may check: the trust model") == "who-may-check-the-trust-model"
    assert slug("The token bucket (`lua/token_bucket.lua`)") == "the-token-bucket-luatoken_bucketlua"


# In docs/architecture.md a file is named `path/to/file.rs`, and what it defines right after
# it: `name` or `Type::name`, several joined by spaces, commas, "and" or "or".
NAMED = re.compile(r"`([\w.-]+/[\w./-]+\.(?:rs|lua))`((?:,?\s+(?:(?:and|or)\s+)?`[A-Za-z_][\w]*(?:::[A-Za-z_]\w*)?`)*)")


def defines(source, name, lua=False):
    """Whether `source` defines `name`: a function, type, trait, impl, const or module (for
    Lua, a local or a function)."""
    n = re.escape(name)
    if lua:
        return re.search(rf"\b(?:local|function)\s+{n}\b", source) is not None
    item = rf"\b(?:fn|struct|enum|trait|type|const|static|mod)\s+{n}\b|\bimpl\b[^{{;]*\b{n}\b"
    return re.search(item, source) is not None


def named_in_architecture():
    """(file, names defined there) for every file the request path names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return [(path, re.findall(r"`([^`]+)`", names)) for path, names in NAMED.findall(text)]


def test_the_request_path_in_architecture_md_names_only_what_the_code_has():
    named = named_in_architecture()
    assert len(named) >= 40, "the request path names its files in `path` `function` form"
    assert sum(len(names) for _, names in named) >= 60
    wrong = []
    for path, names in named:
        file = ROOT / path
        if not file.is_file():
            wrong.append(f"{path}: no such file")
            continue
        source = file.read_text()
        for name in names:
            owner, _, member = name.rpartition("::")
            lua = file.suffix == ".lua"
            if not all(defines(source, part, lua) for part in filter(None, [owner, member])):
                wrong.append(f"{path}: no {name}")
    assert wrong == []


def test_the_readme_is_short_enough_to_read_first():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_each_crates_layout_lists_exactly_its_modules():
    """The `# Layout` of each crate's lib.rs names every module the crate declares, and no
    other, so that a module added or removed cannot leave the reading order stale."""
    stale = {}
    for crate in ["config", "filter", "bridge", "protocol", "wasmtime-harness", "test-support"]:
        lib = (ROOT / crate / "src" / "lib.rs").read_text()
        layout = re.search(r"^//! # Layout\n(.*?)(?=^//! # |^(?!//!))", lib, re.S | re.M)
        assert layout, f"{crate}/src/lib.rs has no # Layout section"
        listed = set(re.findall(r"^//! - `([a-z_]+)`", layout.group(1), re.M))
        declared = set(re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod ([a-z_]+);", lib, re.M))
        if listed != declared:
            stale[crate] = {"unlisted": declared - listed, "no such module": listed - declared}
    assert stale == {}
