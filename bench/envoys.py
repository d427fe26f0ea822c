"""The bench's Envoy gateways: the repository's envoy.yaml (through testbed/stack.py's
`envoy_config`) turned into each configuration of the comparison.

  none      direct response, no filter (the ceiling)
  noop      a wasm filter that does nothing (bench/noop-filter): the cost of any wasm filter
  local     Envoy's native local_ratelimit filter instead of the wasm
  ratelimit dist/ratelimit.wasm with a given plugin configuration, through the bridge
"""

import json
from pathlib import Path

import stack

ROOT = stack.ROOT
NOOP_WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "ratelimit_bench_noop.wasm"
LOADGEN = ROOT / "target" / "release" / "loadgen"
WASM_FUEL = ROOT / "target" / "debug" / "wasm-fuel"  # fuel does not depend on the build profile


def local_ratelimit_filter(per_second, burst):
    """Envoy's local_ratelimit: a native token bucket per gateway, refilled every 50 ms
    (Envoy's shortest fill interval), always enforced."""
    percent = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "bench_local",
            "token_bucket": {"max_tokens": burst, "tokens_per_fill": max(1, per_second // 20),
                             "fill_interval": "0.05s"},
            "filter_enabled": {"runtime_key": "bench_local_enabled", **percent},
            "filter_enforced": {"runtime_key": "bench_local_enforced", **percent},
        },
    }


def gateway_config(kind, listen, admin, bridge_port, plugin=None, local=(10**6, 10**6)):
    """The Envoy configuration (a dict) of one gateway of `kind` (see the module doc)."""
    config = stack.envoy_config(plugin or {}, listen, admin, bridge_port)
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = hcm["typed_config"]["http_filters"]
    wasm, router = filters[0], filters[-1]
    if kind == "none":
        filters[:] = [router]
    elif kind == "noop":
        vm = wasm["typed_config"]["config"]
        vm["name"] = vm["root_id"] = vm["vm_config"]["vm_id"] = "noop"
        vm["vm_config"]["code"]["local"]["filename"] = str(NOOP_WASM)
        vm["configuration"]["value"] = ""
    elif kind == "local":
        filters[:] = [local_ratelimit_filter(*local), router]
    elif kind != "ratelimit":
        raise ValueError(f"unknown gateway kind {kind!r}")
    return config


class Gateway:
    """One Envoy (`--concurrency 1`) of the bench, as a stack.Process."""

    def __init__(self, name, kind, workdir, bridge_port, plugin=None, local=(10**6, 10**6)):
        self.name, self.kind = name, kind
        self.port, self.admin = stack.free_port(), stack.free_port()
        path = Path(workdir) / f"{name}.json"
        path.write_text(json.dumps(
            gateway_config(kind, self.port, self.admin, bridge_port, plugin, local)))
        self.process = stack.Process(name, [
            stack.ENVOY, "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
            "--log-level", "warn"], workdir)

    def start(self):
        self.process.start()
        proc, log = self.process.proc, self.process.log
        stack.wait_for(self.name, lambda: stack.request(self.admin, "/ready", timeout=1)[0] == 200,
                       timeout=60, proc=proc, log=log)
        return self

    def counters(self):
        """The filter's counters (`wasmcustom.ratelimit.*` in /stats), by short name."""
        status, _, body = stack.request(self.admin, "/stats?filter=wasmcustom", timeout=5)
        if status != 200:
            return {}
        out = {}
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name.rsplit(".", 1)[-1]] = int(value)
        return out

    def url(self, path="/api/bench"):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.process.stop()
