"""What `make package` writes, read back the way each host reads it, and the deploy/
manifests checked against each other.

There is no Kubernetes, Istio or Kong on this machine: these tests prove the artifacts have
the form those hosts accept (Istio's image fetcher, Kong's filter metadata) and that the
manifests name each other correctly, not that a cluster runs them. The image is read here
independently of tools/oci.py (testbed/oci_layout.py), as Istio's pkg/wasm/imagefetcher.go
does: the manifest, its last layer (a tar+gzip), the file called plugin.wasm in it; every
digest and size is checked on the way. The bridge's image: test_bridge_image.py."""

import io
import json
import re
import tarfile
from pathlib import Path, PurePosixPath

import yaml
from jsonschema import Draft4Validator

from testbed.oci_layout import Layout

ROOT = Path(__file__).resolve().parent.parent.parent
DIST = ROOT / "dist"
LAYOUT = DIST / "oci"


def wasm():
    return (DIST / "ratelimit.wasm").read_bytes()


def crate_version():
    text = (ROOT / "filter" / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def counter_names():
    """The filter's counters as it defines them (`ratelimit.allowed`, ...)."""
    counters = (ROOT / "filter/src/decision/counters.rs").read_text()
    names = re.findall(r'=> "(ratelimit\.[a-z0-9_]+)"', counters)
    assert len(names) >= 10, names
    return names


def image():
    """Istio's image of dist/ratelimit.wasm, read back."""
    return Layout(LAYOUT)


def wasm_of(layout):
    """The module Istio finds in an image: the file called plugin.wasm in its last layer."""
    (layer,) = layout.layers()[-1:]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        found = [m for m in tar.getmembers() if PurePosixPath(m.name).name == "plugin.wasm"]
        assert len(found) == 1 and found[0].isfile()
        return tar.extractfile(found[0]).read()


def test_istio_finds_plugin_wasm_in_the_last_layer_byte_for_byte():
    layout = image()
    # Not Docker's manifest type: Istio then reads the image as the compat variant.
    assert layout.descriptor["annotations"]["org.opencontainers.image.ref.name"] == crate_version()
    assert len(layout.manifest["layers"]) == 1
    assert wasm_of(layout) == wasm()


def test_every_blob_is_referenced_and_named_by_its_digest():
    layout = image()
    assert layout.stored() == layout.referenced()


def test_the_archive_holds_exactly_the_layout():
    assert image().archived_equals(DIST / "ratelimit-oci.tar")


def test_the_same_wasm_gives_the_same_image(tmp_path):
    from tools import oci

    again = [oci.write(oci.wasm_image(wasm()), tmp_path / f"layout{i}",
                       tmp_path / f"image{i}.tar", "again") for i in range(2)]
    assert again == [image().descriptor["digest"]] * 2
    assert (tmp_path / "image0.tar").read_bytes() == (tmp_path / "image1.tar").read_bytes()


def test_kong_gets_the_filter_and_its_schema():
    assert (DIST / "kong" / "ratelimit.wasm").read_bytes() == wasm()
    schema = json.loads((ROOT / "schema" / "ratelimit.schema.json").read_text())
    assert json.loads((DIST / "ratelimit.schema.json").read_text()) == schema
    meta = json.loads((DIST / "kong" / "ratelimit.meta.json").read_text())
    assert set(meta) == {"config_schema", "metrics"}
    assert meta["config_schema"] == schema
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    Draft4Validator.check_schema(schema)


def test_kong_labels_per_rule_counters_and_leaves_the_global_ones_alone():
    patterns = json.loads((DIST / "kong" / "ratelimit.meta.json").read_text())["metrics"]["label_patterns"]
    assert patterns and all(set(p) == {"label", "pattern"} for p in patterns)
    rule = next(p for p in patterns if p["label"] == "rule")
    # Kong's reading (kong/plugins/prometheus/wasmx.lua): group 1 leaves the name, group 2
    # is the label's value.
    key = "pw:ratelimit:ratelimit.denied_rule=search-per-ip.v2"
    match = re.search(rule["pattern"], key)
    assert match.group(2) == "search-per-ip.v2"
    assert key[:match.start(1)] == "pw:ratelimit:ratelimit.denied_rule"
    for name in counter_names():
        assert not any(re.search(p["pattern"], f"pw:ratelimit:{name}") for p in patterns), name


def kong_filters():
    config = yaml.safe_load((ROOT / "deploy" / "kong" / "kong.yaml").read_text())
    assert config["_format_version"] == "3.0"
    return [f for service in config["services"] for chain in service.get("filter_chains", [])
            for f in chain["filters"]]


def empties(node, path="config"):
    """Where `node` holds an empty list or object (which Kong's cjson writes as {})."""
    if isinstance(node, (list, dict)) and not node:
        return [path]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [e for key, value in items for e in empties(value, f"{path}.{key}")]


def test_the_kong_example_is_a_filter_chain_of_this_filter_over_http():
    filters = kong_filters()
    assert [f["name"] for f in filters] == ["ratelimit"]  # the wasm file's name in dist/kong
    config = filters[0]["config"]
    assert config["backend"]["transport"] == "http"
    assert re.fullmatch(r"[A-Za-z0-9.-]+:[0-9]{1,5}", config["backend"]["cluster"])
    assert empties(config) == []


def manifests(name):
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / "istio" / name).read_text()) if d]


def one(docs, kind, name=None):
    (found,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def test_the_wasmplugin_reaches_the_bridge_service_over_http2():
    plugin = one(manifests("wasmplugin.yaml"), "WasmPlugin")["spec"]
    bridge = manifests("bridge.yaml")
    service = one(bridge, "Service", "ratelimit-bridge")
    (port,) = [p for p in service["spec"]["ports"] if p.get("appProtocol") == "http2"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    backend = plugin["pluginConfig"]["backend"]
    assert backend["cluster"] == f"outbound|{port['port']}||{name}.{namespace}.svc.cluster.local"
    assert backend.get("transport", "grpc") == "grpc"
    deployment = one(bridge, "Deployment", "ratelimit-bridge")
    assert deployment["metadata"]["namespace"] == namespace
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert port["targetPort"] in [p["containerPort"] for p in container["ports"]]
    assert f"--listen=0.0.0.0:{port['targetPort']}" in container["args"]
    assert f"--key-prefix={plugin['pluginConfig'].get('key_prefix', 'rl')}" in container["args"]
    # The bridge's Redis is the Valkey Service.
    valkey = one(manifests("valkey.yaml"), "Service", "valkey")
    (redis_port,) = valkey["spec"]["ports"]
    host = f"{valkey['metadata']['name']}.{valkey['metadata']['namespace']}.svc.cluster.local"
    assert f"--redis=redis://{host}:{redis_port['port']}" in container["args"]
    valkey_pod = one(manifests("valkey.yaml"), "Deployment", "valkey")["spec"]["template"]
    assert valkey["spec"]["selector"].items() <= valkey_pod["metadata"]["labels"].items()


def test_the_wasmplugin_runs_after_jwt_authentication_on_the_verified_payload():
    docs = manifests("wasmplugin.yaml")
    plugin = one(docs, "WasmPlugin")["spec"]
    assert plugin["phase"] == "AUTHZ" and isinstance(plugin["priority"], int)
    assert plugin["failStrategy"] in ("FAIL_CLOSE", "FAIL_OPEN")
    assert plugin["url"] == f"oci://registry.example.com/ratelimit:{crate_version()}"
    authn = one(docs, "RequestAuthentication")["spec"]
    assert authn["selector"] == plugin["selector"]
    headers = {rule["outputPayloadToHeader"] for rule in authn["jwtRules"]}
    jwt_headers = {i["jwt"]["header"] for i in plugin["pluginConfig"]["identity"].values()
                   if i.get("jwt") and not i["jwt"].get("unverified")}
    assert jwt_headers and jwt_headers <= headers


def test_the_rendered_wasmplugin_pins_the_built_image():
    descriptor = image().descriptor
    template = manifests("wasmplugin.yaml")
    rendered = [d for d in yaml.safe_load_all((DIST / "istio" / "wasmplugin.yaml").read_text()) if d]
    plugin = one(rendered, "WasmPlugin")
    assert plugin["spec"]["sha256"] == descriptor["digest"].removeprefix("sha256:")
    plugin["spec"]["sha256"] = one(template, "WasmPlugin")["spec"]["sha256"]
    assert rendered == template


def test_the_stats_matcher_lets_every_counter_through():
    (operator,) = manifests("proxy-stats.yaml")
    matcher = operator["spec"]["meshConfig"]["defaultConfig"]["proxyStatsMatcher"]
    for name in counter_names():
        assert any(f"wasmcustom.{name}".startswith(p) for p in matcher["inclusionPrefixes"]), name


def test_istio_tags_per_rule_counters_with_the_regex_envoy_yaml_uses():
    (config_map,) = manifests("stats-tags.yaml")
    bootstrap = json.loads(config_map["data"]["custom_bootstrap.json"])
    envoy = yaml.safe_load((ROOT / "envoy.yaml").read_text())
    assert bootstrap["stats_config"] == envoy["stats_config"]
    (tag,) = bootstrap["stats_config"]["stats_tags"]
    match = re.search(tag["regex"], "wasmcustom.ratelimit.allowed_leased_rule=login.v1")
    assert (match.group(2), match.string[:match.start(1)]) == \
        ("login.v1", "wasmcustom.ratelimit.allowed_leased_rule")
    for name in counter_names():
        assert not re.search(tag["regex"], f"wasmcustom.{name}"), name


def wasm_imports(module):
    """The `module.name` of every function a wasm binary imports (its import section)."""
    assert module[:8] == b"\0asm\x01\0\0\0"

    def uleb(at):
        value = shift = 0
        while True:
            byte = module[at]
            value |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if byte < 0x80:
                return value, at

    def name(at):
        size, at = uleb(at)
        return module[at:at + size].decode(), at + size

    at = 8
    while at < len(module):
        section, size_at = module[at], at + 1
        size, at = uleb(size_at)
        if section == 2:
            count, cursor = uleb(at)
            imports = []
            for _ in range(count):
                mod, cursor = name(cursor)
                field, cursor = name(cursor)
                kind, cursor = module[cursor], cursor + 1
                assert kind == 0, "the filter imports functions only"
                _, cursor = uleb(cursor)
                imports.append(f"{mod}.{field}")
            return imports
        at += size
    return []


def test_only_the_redis_build_imports_higress_s_redis_call():
    stock = wasm_imports(wasm())
    redis = wasm_imports((DIST / "ratelimit-redis.wasm").read_bytes())
    # Stock Envoy, Istio and Kong refuse a module importing a function they lack.
    assert stock and not [i for i in stock if "redis" in i]
    assert sorted(i for i in redis if "redis" in i) == ["env.proxy_redis_call",
                                                        "env.proxy_redis_init"]
    assert set(stock) <= set(redis)


def test_the_higress_wasmplugin_runs_the_redis_build_on_a_redis_service():
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "deploy" / "higress" / "wasmplugin.yaml")
                                            .read_text()) if d]
    assert doc["apiVersion"] == "extensions.higress.io/v1alpha1" and doc["kind"] == "WasmPlugin"
    spec = doc["spec"]
    assert spec["url"] == f"oci://registry.example.com/ratelimit-redis:{crate_version()}"
    backend = spec["defaultConfig"]["backend"]
    assert set(backend) == {"redis"}
    assert re.fullmatch(r"outbound\|\d+\|\|[a-z0-9.-]+", backend["redis"]["cluster"])
    schema = json.loads((ROOT / "schema" / "ratelimit.schema.json").read_text())
    # The configuration as Higress hands it to the plugin: defaultConfig, and each of
    # matchRules as a `_rules_` entry (ingress -> _match_route_, domain -> _match_domain_).
    entries = []
    for match in spec["matchRules"]:
        assert set(match) in ({"ingress", "config"}, {"domain", "config"}), match
        kind = "_match_route_" if "ingress" in match else "_match_domain_"
        entries.append({kind: match.get("ingress") or match["domain"], **match["config"]})
    assert {next(iter(e)) for e in entries} == {"_match_route_", "_match_domain_"}
    config = {**spec["defaultConfig"], "_rules_": entries}
    assert list(Draft4Validator(schema).iter_errors(config)) == []
    names = [r["name"] for r in config["rules"]] + \
        [r["name"] for e in entries for r in e["rules"]]
    assert len(names) == len(set(names)), "rule names are unique across all the rules"


def test_the_rendered_higress_wasmplugin_pins_its_image_of_the_redis_build():
    layout = Layout(DIST / "higress" / "oci")
    descriptor = layout.descriptor
    assert wasm_of(layout) == (DIST / "ratelimit-redis.wasm").read_bytes()
    (rendered,) = [d for d in yaml.safe_load_all((DIST / "higress" / "wasmplugin.yaml")
                                                 .read_text()) if d]
    assert rendered["spec"]["sha256"] == descriptor["digest"].removeprefix("sha256:")
