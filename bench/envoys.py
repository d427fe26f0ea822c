"""The bench's Envoy gateways: the repository's envoy.yaml (through testbed/stack.py's
`envoy_config`) turned into each configuration of the comparison.

Kinds (the HTTP filter of the gateway listener):

  none      no filter (the ceiling)
  noop      a wasm filter that does nothing (bench/noop-filter): the cost of any wasm filter
  floor     the no-op filter making one HTTP/2 callout per request to a trivial responder:
            the floor of any one-callout-per-request design
  headers   the no-op filter making only the host calls of an allowed response (the whole
            request header map, the clock, three X-RateLimit-* response headers): the
            floor of any filter that admits without a callout and shows the limit
  local     Envoy's native local_ratelimit filter instead of the wasm
  ratelimit dist/ratelimit.wasm with a given plugin configuration, through the bridge
  module    dist/libratelimit.so, the same filter as a native dynamic module, with the
            given plugin configuration
  rls       Envoy's own ratelimit filter, the bridge as its rate limit service
            (`--rls-config`), one descriptor per request: the `x-user-id` header

Bases (what answers the request once the filter lets it through):

  proxy     as production gateways do: the gateway's route goes to a cluster, an HTTP/1.1
            upstream that is a second listener of the same Envoy (`--concurrency 1`, so
            the same worker thread) answering with envoy.yaml's direct_response
  direct    envoy.yaml's direct_response on the gateway listener itself (no upstream)
  server    the route goes to a server of its own on `upstream_port` (HTTP/1.1, through
            testbed/stack.py's route_to_upstream): bench's `sse-upstream`, which streams,
            as a direct_response cannot

Every gateway also has the callout floor's responder: a third listener with the same
direct_response, spoken to over h2c through the HTTP/2 cluster `bench_responder`.
"""

import copy
import json
from pathlib import Path

from testbed import stack

ROOT = stack.ROOT
NOOP_WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "ratelimit_bench_noop.wasm"
LOADGEN = ROOT / "target" / "release" / "loadgen"
SSE_UPSTREAM = ROOT / "target" / "release" / "sse-upstream"
WASM_FUEL = ROOT / "target" / "debug" / "wasm-fuel"  # fuel does not depend on the build profile

UPSTREAM = "bench_upstream"
RESPONDER = "bench_responder"
# The no-op filter's configuration for the callout floor.
FLOOR_PLUGIN = {"callout": {"cluster": RESPONDER, "authority": "responder", "path": "/"}}
# The no-op filter's configuration for the headers floor: the identity header the
# ratelimit.wasm configurations key on.
HEADERS_PLUGIN = {"headers": {"identity": "x-user-id"}}
# What the no-op filter is configured with, by gateway kind.
NOOP_PLUGINS = {"noop": None, "floor": FLOOR_PLUGIN, "headers": HEADERS_PLUGIN}


# The rate limit service's domain and descriptor key of the `rls` kind.
RLS_DOMAIN = "bench"
RLS_KEY = "user"


def rls_filter():
    """Envoy's ratelimit filter calling the bridge's rate limit service on envoy.yaml's
    bridge cluster (HTTP/2), failing closed as the wasm configurations do."""
    return {
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": RLS_DOMAIN, "timeout": "0.25s", "failure_mode_deny": True,
            "rate_limit_service": {"transport_api_version": "V3", "grpc_service": {
                "envoy_grpc": {"cluster_name": "ratelimit_bridge"}}}},
    }


def local_ratelimit_filter(per_second, burst):
    """Envoy's local_ratelimit: a native token bucket per gateway, refilled every 50 ms
    (Envoy's shortest fill interval), always enforced; `per_second` 0 refills one token an
    hour (a bucket a run exhausts for good)."""
    percent = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
    fill = {"tokens_per_fill": max(1, per_second // 20), "fill_interval": "0.05s"} if per_second \
        else {"tokens_per_fill": 1, "fill_interval": "3600s"}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "bench_local",
            "token_bucket": {"max_tokens": burst, **fill},
            "filter_enabled": {"runtime_key": "bench_local_enabled", **percent},
            "filter_enforced": {"runtime_key": "bench_local_enforced", **percent},
        },
    }


def answering_listener(gateway, name, port):
    """A copy of the gateway listener on `port` with only the router: it answers every
    request with envoy.yaml's direct_response (HTTP/1.1 or h2c, the codec is automatic)."""
    listener = copy.deepcopy(gateway)
    listener["name"] = name
    listener["address"]["socket_address"]["port_value"] = port
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = name
    hcm["http_filters"] = hcm["http_filters"][-1:]
    return listener


def local_cluster(template, name, port, http2):
    """A cluster shaped like envoy.yaml's bridge cluster, to 127.0.0.1:`port`."""
    cluster = copy.deepcopy(template)
    cluster["name"] = cluster["load_assignment"]["cluster_name"] = name
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"]["port_value"] = port
    if not http2:
        cluster.pop("typed_extension_protocol_options", None)
    return cluster


def gateway_config(kind, listen, admin, bridge_port, plugin=None, local=(10**6, 10**6),
                   base="proxy", upstream_port=None, responder_port=None):
    """The Envoy configuration (a dict) of one gateway of `kind` on `base` (module doc)."""
    config = stack.envoy_config(plugin or {}, listen, admin, bridge_port,
                                upstream=upstream_port if base == "server" else None)
    resources = config["static_resources"]
    gateway = resources["listeners"][0]
    hcm = gateway["filter_chains"][0]["filters"][0]["typed_config"]
    bridge = next(c for c in resources["clusters"] if c["name"] == "ratelimit_bridge")
    resources["listeners"].append(answering_listener(gateway, RESPONDER, responder_port))
    resources["clusters"].append(local_cluster(bridge, RESPONDER, responder_port, http2=True))
    if base == "proxy":
        resources["listeners"].append(answering_listener(gateway, UPSTREAM, upstream_port))
        resources["clusters"].append(local_cluster(bridge, UPSTREAM, upstream_port, http2=False))
        for host in hcm["route_config"]["virtual_hosts"]:
            host["routes"] = [{"match": {"prefix": "/"}, "route": {"cluster": UPSTREAM}}]
    elif base not in ("direct", "server"):
        raise ValueError(f"unknown base {base!r}")
    filters = hcm["http_filters"]
    wasm, router = filters[0], filters[-1]
    if kind == "none":
        filters[:] = [router]
    elif kind in NOOP_PLUGINS:
        vm = wasm["typed_config"]["config"]
        vm["name"] = vm["root_id"] = vm["vm_config"]["vm_id"] = "noop"
        vm["vm_config"]["code"]["local"]["filename"] = str(NOOP_WASM)
        noop_plugin = NOOP_PLUGINS[kind]
        vm["configuration"]["value"] = json.dumps(noop_plugin) if noop_plugin else ""
    elif kind == "local":
        filters[:] = [local_ratelimit_filter(*local), router]
    elif kind == "module":
        filters[0] = stack.module_filter(plugin or {})
    elif kind == "rls":
        filters[:] = [rls_filter(), router]
        user = {"request_headers": {"header_name": "x-user-id", "descriptor_key": RLS_KEY}}
        for host in hcm["route_config"]["virtual_hosts"]:
            for route in host["routes"]:
                route["route"]["rate_limits"] = [{"actions": [user]}]
    elif kind != "ratelimit":
        raise ValueError(f"unknown gateway kind {kind!r}")
    return config


class Gateway:
    """One Envoy (`--concurrency 1` unless told) of the bench, as a stack.Process."""

    def __init__(self, name, kind, workdir, bridge_port, plugin=None, local=(10**6, 10**6),
                 base="proxy", concurrency=1, upstream_port=None):
        """`upstream_port`: the server's with the `server` base."""
        self.name, self.kind, self.base = name, kind, base
        self.port, self.admin = stack.free_port(), stack.free_port()
        path = Path(workdir) / f"{name}.json"
        path.write_text(json.dumps(gateway_config(
            kind, self.port, self.admin, bridge_port, plugin, local, base,
            upstream_port=upstream_port or stack.free_port(),
            responder_port=stack.free_port())))
        self.process = stack.Process(name, [
            stack.ENVOY, "-c", str(path), "--concurrency", str(concurrency),
            "--disable-hot-restart", "--log-level", "warn"], workdir)

    def start(self):
        self.process.start()
        proc, log = self.process.proc, self.process.log
        stack.wait_for(self.name, lambda: stack.request(self.admin, "/ready", timeout=1)[0] == 200,
                       timeout=60, proc=proc, log=log)
        return self

    def counters(self):
        """The filter's counters (`wasmcustom.ratelimit.*` in /stats, the module's
        `dynamicmodulescustom.ratelimit.*`), by short name."""
        return stack.filter_counters(self.admin, stack.COUNTER_PREFIXES[
            "module" if self.kind == "module" else "wasm"])

    def url(self, path="/api/bench"):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.process.stop()
