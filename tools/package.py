"""`make package`: dist/ratelimit.wasm as each host takes it, next to what `make build` made.

- dist/ratelimit.schema.json: the plugin configuration's JSON Schema (schema/).
- dist/kong/: `ratelimit.wasm` and `ratelimit.meta.json` for Kong's `wasm_filters_path`;
  the meta file's `config_schema` is the schema, so Kong validates a filter chain's config
  before the filter sees it, and `metrics.label_patterns` turns the rule name in per-rule
  counter names into a Prometheus label.
- dist/oci/ and dist/ratelimit-oci.tar: the Wasm image Istio pulls (tools/oci.py), and
  dist/istio/wasmplugin.yaml: deploy/istio/wasmplugin.yaml with the image's digest pinned.
- dist/higress/: the same for dist/ratelimit-redis.wasm, the redis-call build Higress runs
  (Higress pulls Istio's image format): oci/, ratelimit-redis-oci.tar and wasmplugin.yaml
  from deploy/higress/wasmplugin.yaml.
- dist/bridge/: the bridge's container image (tools/oci.py) of the static build the
  Makefile leaves in dist/bridge/ratelimit-bridge, with Mozilla's CA roots (certifi) for
  `rediss://`: oci/, ratelimit-bridge-oci.tar, and dist/istio/bridge.yaml:
  deploy/istio/bridge.yaml with the image's digest pinned.

Prints the digests: what Istio's `WasmPlugin.sha256` wants, and the bridge's image.
"""

import hashlib
import json
import re
import shutil
from pathlib import Path

import certifi
import oci

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
WASM = DIST / "ratelimit.wasm"
REDIS_WASM = DIST / "ratelimit-redis.wasm"
SCHEMA = ROOT / "schema" / "ratelimit.schema.json"
WASMPLUGIN = ROOT / "deploy" / "istio" / "wasmplugin.yaml"
BRIDGE_YAML = ROOT / "deploy" / "istio" / "bridge.yaml"
BRIDGE_DIR = DIST / "bridge"
HIGRESS_WASMPLUGIN = ROOT / "deploy" / "higress" / "wasmplugin.yaml"
# The placeholder in deploy/istio/wasmplugin.yaml that the image's digest replaces.
DIGEST_PLACEHOLDER = "IMAGE_MANIFEST_SHA256"

# Kong names a filter's metrics `pw:<filter>:<name>` and takes each pattern's first group
# out of the name and its second as the label's value. Per-rule counters are named
# `ratelimit.<counter>_rule=<rule name>` (filter/src/decision/counters.rs; a rule name has
# no `=`): `ratelimit.denied_rule` with a `rule` label, as envoy.yaml's `stats_tags` makes
# them.
# The global counters match no pattern.
LABEL_PATTERNS = [{"label": "rule", "pattern": "_rule(=([A-Za-z0-9._-]+))$"}]


def version(crate="filter"):
    """A crate's version: the tag of its image (the filter's for the Wasm images, the
    bridge's for the bridge's)."""
    manifest = (ROOT / crate / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', manifest, re.M).group(1)


def pinned(built, layout, archive, template, rendered, tag):
    """Writes image `built` (an `oci.image`) tagged `tag`, and `template` with the image's
    digest as `rendered`; returns the digest."""
    digest = oci.write(built, layout, archive, tag)
    text = template.read_text()
    if text.count(DIGEST_PLACEHOLDER) != 1:
        raise SystemExit(f"{template} must hold {DIGEST_PLACEHOLDER} once, as its sha256")
    rendered.parent.mkdir(exist_ok=True)
    rendered.write_text(text.replace(DIGEST_PLACEHOLDER, digest.removeprefix("sha256:")))
    return digest


def main():
    wasm = WASM.read_bytes()
    schema = json.loads(SCHEMA.read_text())
    shutil.copyfile(SCHEMA, DIST / "ratelimit.schema.json")

    kong = DIST / "kong"
    kong.mkdir(exist_ok=True)
    shutil.copyfile(WASM, kong / "ratelimit.wasm")
    meta = {"config_schema": schema, "metrics": {"label_patterns": LABEL_PATTERNS}}
    (kong / "ratelimit.meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    tag, bridge_tag = version(), version("bridge")
    digest = pinned(oci.wasm_image(wasm), DIST / "oci", DIST / "ratelimit-oci.tar", WASMPLUGIN,
                    DIST / "istio" / "wasmplugin.yaml", tag)
    higress = DIST / "higress"
    redis_digest = pinned(oci.wasm_image(REDIS_WASM.read_bytes()), higress / "oci",
                          higress / "ratelimit-redis-oci.tar", HIGRESS_WASMPLUGIN,
                          higress / "wasmplugin.yaml", tag)
    bridge = oci.bridge_image((BRIDGE_DIR / "ratelimit-bridge").read_bytes(),
                              Path(certifi.where()).read_bytes(), bridge_tag)
    bridge_digest = pinned(bridge, BRIDGE_DIR / "oci", BRIDGE_DIR / "ratelimit-bridge-oci.tar",
                           BRIDGE_YAML, DIST / "istio" / "bridge.yaml", bridge_tag)

    print(f"""dist/ratelimit.schema.json
dist/kong/ratelimit.wasm, dist/kong/ratelimit.meta.json (Kong's wasm_filters_path: dist/kong)
dist/oci/ (tag {tag}), dist/ratelimit-oci.tar: Istio's Wasm image (compat: one tar+gzip layer with plugin.wasm)
  image manifest    {digest}
      = WasmPlugin.sha256 for an oci:// url (Istio checks the manifest's digest); pinned in dist/istio/wasmplugin.yaml
  plugin.wasm       sha256:{hashlib.sha256(wasm).hexdigest()}
      = WasmPlugin.sha256 for an http(s):// url serving dist/ratelimit.wasm
dist/higress/oci/, dist/higress/ratelimit-redis-oci.tar: Higress's image of dist/ratelimit-redis.wasm
  image manifest    {redis_digest}
      pinned in dist/higress/wasmplugin.yaml
dist/bridge/oci/ (tag {bridge_tag}), dist/bridge/ratelimit-bridge-oci.tar: the bridge's image (linux/amd64, static, user {oci.BRIDGE_USER})
  image manifest    {bridge_digest}
      pinned in dist/istio/bridge.yaml""")


if __name__ == "__main__":
    main()
