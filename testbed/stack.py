#!/usr/bin/env python3
"""The real stack on loopback: Valkey, ratelimit-bridge and N Envoy gateways loading
dist/ratelimit.wasm, each on a free port, started from the repository's own envoy.yaml.

Used by the end-to-end tests, the demo and `make testbed` (which keeps it up until Ctrl-C).
Every process is started in its own session and stopped by `Stack.close()`, which also
runs at interpreter exit, so nothing outlives the run.
"""

import atexit
import copy
import itertools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import valkey
import yaml

from .client import request, stream  # `request` was defined here: the tests import it from here

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
ENVOY = os.environ.get("RATELIMIT_ENVOY", str(VENV_BIN / "envoy"))
VALKEY = os.environ.get("RATELIMIT_VALKEY", str(VENV_BIN / "valkey-server"))
BRIDGE = os.environ.get("RATELIMIT_BRIDGE", str(ROOT / "dist" / "ratelimit-bridge"))
WASM = os.environ.get("RATELIMIT_WASM", str(ROOT / "dist" / "ratelimit.wasm"))
# Which build of the filter the gateways load: `wasm` (ratelimit.wasm), or `module`, the same
# filter as a native dynamic module (dist/libratelimit.so, in Envoy's
# envoy.filters.http.dynamic_modules): `RATELIMIT_FILTER=module pytest ...` runs a test
# against it (`make test-module`).
FILTER = os.environ.get("RATELIMIT_FILTER", "wasm")
MODULE_DIR = os.environ.get("RATELIMIT_MODULE_DIR", str(ROOT / "dist"))
# Where each build's counters are in Envoy's /stats.
COUNTER_PREFIXES = {"wasm": "wasmcustom.ratelimit", "module": "dynamicmodulescustom.ratelimit"}
COUNTERS = COUNTER_PREFIXES[FILTER]
# Every Envoy the testbed starts finds the module there (it looks for lib<name>.so).
os.environ.setdefault("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", MODULE_DIR)


# Test ports come from below Linux's ephemeral range (32768 and up), so no outgoing
# connection can take a port between the moment it is picked and the moment its server
# binds it (which failed CI once with EADDRINUSE). Never the same port twice in a process,
# and each pytest-xdist worker has a slice of its own: two workers walking one range picked
# the same free port before either's server bound it (EADDRINUSE on 3 workers).
ALL_TEST_PORTS = range(32000, 20000, -1)


def _worker_ports():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return ALL_TEST_PORTS
    size = len(ALL_TEST_PORTS) // count
    n = int(worker[2:])
    return ALL_TEST_PORTS[n * size:(n + 1) * size]


TEST_PORTS = _worker_ports()
_next_port = itertools.count(os.getpid() * 7919)


def free_port():
    for _ in TEST_PORTS:
        port = TEST_PORTS[next(_next_port) % len(TEST_PORTS)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {TEST_PORTS} on 127.0.0.1")


def wait_for(what, ready, timeout=30.0, proc=None, log=None):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            if ready():
                return
        except Exception as e:  # noqa: BLE001 - not ready yet, whatever the client raised
            last_error = e
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {timeout}s (last error: {last_error})")


def redis_command(port, *args):
    """One command to the Valkey on `port`, on a connection of its own; replies decoded to
    text (lists, dicts as the `valkey` client returns them)."""
    client = valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


def bucket_units(port, key):
    """A bucket's level in units, read from the Valkey on `port` as lua/token_bucket.lua
    stores it: struct '<Bddd' (tag 3, units, Redis ms, the units' den)."""
    raw = valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=5).get(key)
    tag, units, _, _ = struct.unpack("<Bddd", raw)
    assert tag == 3, raw
    return int(units)


class Background:
    """A thread that runs `self.run()` until `stop()` sets `self.stopping` (which `run`
    watches); the loads and samplers of the soak and the attacks."""

    join_timeout = 15

    def __init__(self):
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=self.join_timeout)

    def run(self):
        raise NotImplementedError


class Process:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, name, argv, workdir):
        self.name, self.argv = name, argv
        self.log = str(Path(workdir) / f"{name}.log")
        self.proc = None
        # Variables added to the environment it starts with.
        self.env = {}

    def start(self):
        env = {**os.environ, **self.env} if self.env else None
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        return self

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            self.kill()

    def kill(self):
        """SIGKILL, as a crash would: no graceful shutdown. `start()` starts it again."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


# The wasm filter's configuration as Envoy discovers it from a file (ECDS) in a
# reloadable stack: the filter entry that names it, and the resource the file holds.
FILTER_NAME = "envoy.filters.http.wasm"


def discovered_filter(path, filter_type):
    return {"name": FILTER_NAME, "config_discovery": {
        "config_source": {"path_config_source": {"path": str(path)},
                          "resource_api_version": "V3"},
        "type_urls": [filter_type]}}


def filter_resource(wasm_filter):
    return {"resources": [{"@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                           "name": FILTER_NAME, "typed_config": wasm_filter["typed_config"]}]}


# A real upstream for the route (testbed/llm_upstream.py's, say) instead of envoy.yaml's
# `direct_response`: slow streams must pass, so the route waits a minute for a whole
# response and a minute of silence within it, and Envoy's circuit breakers (1,024
# requests by default) stay out of the way of load tests, which the filter limits.
UPSTREAM_TIMEOUT = "60s"


def route_to_upstream(config, port, prefix="/"):
    """`config`'s route `upstream` sent to a cluster `upstream`: HTTP/1.1 on 127.0.0.1:`port`;
    with another `prefix`, only the paths under it (a route of their own, before it), the
    others still answered by envoy.yaml's stand-in."""
    routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    target = {"cluster": "upstream", "timeout": UPSTREAM_TIMEOUT,
              "idle_timeout": UPSTREAM_TIMEOUT}
    if prefix == "/":
        route = next(r for r in routes if r["name"] == "upstream")
        route.pop("direct_response")
        route["route"] = target
    else:
        routes.insert(0, {"name": "routed", "match": {"prefix": prefix}, "route": target})
    many = {"max_connections": 100000, "max_pending_requests": 100000,
            "max_requests": 100000, "max_retries": 3}
    config["static_resources"]["clusters"].append({
        "name": "upstream", "type": "STATIC", "connect_timeout": "1s",
        "circuit_breakers": {"thresholds": [many]},
        "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": port}}}}]}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http_protocol_options": {}}}}})
    return config


def module_filter(plugin):
    """The HTTP filter entry that loads `plugin` into the dynamic module build."""
    return {"name": "ratelimit", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3."
                 "DynamicModuleFilter",
        "dynamic_module_config": {"name": "ratelimit"},
        "filter_name": "ratelimit",
        "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                          "value": json.dumps(plugin)}}}


def envoy_config(plugin, listen_port, admin_port, bridge_port, raw_paths=False,
                 filters_before=(), upstream=None, upstream_prefix="/"):
    """envoy.yaml with this gateway's ports, the wasm path and the plugin configuration.
    `raw_paths` turns Envoy's own path normalization off (`normalize_path`,
    `merge_slashes`), so that the filter sees `:path` exactly as the client sent it.
    `filters_before` are HTTP filters run before the wasm filter (e.g. `jwt_authn`).
    `upstream` (a port) routes to a server there instead of envoy.yaml's stand-in: every
    path, or those under `upstream_prefix`."""
    config = yaml.safe_load((ROOT / "envoy.yaml").read_text())
    config = copy.deepcopy(config)
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = listen_port
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = hcm["http_filters"][0]["typed_config"]["config"]
    wasm["vm_config"]["code"]["local"]["filename"] = WASM
    wasm["configuration"]["value"] = json.dumps(plugin)
    if FILTER == "module":
        hcm["http_filters"][0] = module_filter(plugin)
        # The module's counters under the wasm filter's names at /stats/prometheus
        # (`ratelimit_*`, the rule a tag), as docs/hosts.md tells its users to set.
        tags = config["stats_config"]["stats_tags"]
        tags.append({"tag_name": "rule", "regex": tags[0]["regex"].replace(
            "wasmcustom", "dynamicmodulescustom")})
        config["layered_runtime"] = {"layers": [{"name": "static", "static_layer": {
            "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix": True}}]}
    if raw_paths:
        hcm["normalize_path"] = False
        hcm["merge_slashes"] = False
    hcm["http_filters"][:0] = copy.deepcopy(list(filters_before))
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "ratelimit_bridge":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"]["socket_address"]["port_value"] = bridge_port
    return config if upstream is None else route_to_upstream(config, upstream, upstream_prefix)


def default_plugin():
    """The plugin configuration written in envoy.yaml."""
    config = yaml.safe_load((ROOT / "envoy.yaml").read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    wasm = hcm["typed_config"]["http_filters"][0]["typed_config"]["config"]
    return json.loads(wasm["configuration"]["value"])


def filter_counters(admin_port, prefix=COUNTERS):
    """The filter's counters (`wasmcustom.ratelimit.*` in Envoy's /stats, or `prefix`) by
    short name: {"allowed": 3, "callouts": 3, "denied_rule=per-user": 1, ...}; empty if the
    admin port does not answer."""
    status, _, body = request(admin_port, f"/stats?filter={prefix}", timeout=5)
    if status != 200:
        return {}
    pairs = (line.partition(": ") for line in body.splitlines())
    return {name.removeprefix(f"{prefix}."): int(value) for name, _, value in pairs
            if value.strip().isdigit()}


def load_error(plugin):
    """The log of an Envoy asked to load `plugin`, which it must refuse (the stack fails to
    start)."""
    stack = Stack(plugin, gateways=1)
    try:
        try:
            stack.start()
        except RuntimeError:
            return stack.logs("envoy-0")
        raise AssertionError("the gateway accepted the plugin configuration")
    finally:
        stack.close()


class Stack:
    """Valkey + bridge + `gateways` Envoys; `plugin` is the filter's JSON configuration,
    `raw_paths`, `filters_before`, `upstream` and `upstream_prefix` as in `envoy_config`
    (the first two not with `reloadable`)."""

    def __init__(self, plugin=None, gateways=2, workdir=None, cluster=None, raw_paths=False,
                 bridge_args=(), reloadable=False, filters_before=(), valkey_args=(),
                 upstream=None, upstream_prefix="/", bridge_via=None):
        for path in (ENVOY, VALKEY, BRIDGE, WASM):
            if not Path(path).exists():
                raise RuntimeError(f"{path} is missing: run `make setup build` first")
        self.plugin = plugin if plugin is not None else default_plugin()
        self.own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="ratelimit-testbed-")
        self.redis_port = free_port()
        self.bridge_port = free_port()
        # Where the bridge answers /healthz in plaintext: its port, or a probe port of its
        # own (`--probe-listen`) when that one speaks TLS.
        self.health_port = self.bridge_port
        self.valkey = Process("valkey", [
            VALKEY, "--port", str(self.redis_port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", *valkey_args], self.workdir)
        # With a `cluster` (a ValkeyCluster of testbed/cluster.py or a SentinelGroup of
        # testbed/sentinel.py, started by the caller) the bridge uses it instead of a Valkey
        # of the stack's own: `redis_args` are the bridge's flags that name it.
        self.cluster = cluster
        self.redis_args = cluster.bridge_args() if cluster else \
            ["--redis", f"redis://127.0.0.1:{self.redis_port}"]
        self.bridge = Process("bridge", [
            BRIDGE, "--listen", f"127.0.0.1:{self.bridge_port}", *self.redis_args,
            "--threads", "1", *bridge_args], self.workdir)
        self.envoys = []
        self.ports = []
        self.admin_ports = []
        # Reloadable: each gateway discovers its wasm filter from a file (ECDS), which
        # `reconfigure` replaces.
        self.filter_files = []
        for i in range(gateways):
            port, admin = free_port(), free_port()
            path = Path(self.workdir) / f"envoy-{i}.json"
            # `bridge_via`: the port the gateways reach the bridge through (a fault proxy's).
            config = envoy_config(self.plugin, port, admin, bridge_via or self.bridge_port,
                                  raw_paths, filters_before, upstream, upstream_prefix)
            if reloadable:
                filters = config["static_resources"]["listeners"][0]["filter_chains"][0][
                    "filters"][0]["typed_config"]["http_filters"]
                self.filter_files.append(Path(self.workdir) / f"filter-{i}.json")
                self.filter_files[i].write_text(json.dumps(filter_resource(filters[0])))
                filters[0] = discovered_filter(self.filter_files[i],
                                               filters[0]["typed_config"]["@type"])
                config["node"] = {"id": f"gateway-{i}", "cluster": "testbed"}
            path.write_text(json.dumps(config))
            self.envoys.append(Process(f"envoy-{i}", [
                ENVOY, "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
                "--log-level", "warn", "--component-log-level",
                "wasm:info,dynamic_modules:info"], self.workdir))
            self.ports.append(port)
            self.admin_ports.append(admin)
        atexit.register(self.close)

    def start(self):
        try:
            if self.cluster is None:
                self.start_valkey()
            self.start_bridge()
            for envoy, port, admin in zip(self.envoys, self.ports, self.admin_ports):
                envoy.start()
                wait_for(envoy.name, lambda a=admin: request(a, "/ready", timeout=1)[0] == 200,
                         timeout=60, proc=envoy.proc, log=envoy.log)
                wait_for(envoy.name, lambda p=port: socket.create_connection(("127.0.0.1", p), 1).close() or True)
        except Exception:
            self.stop()  # the logs stay for the caller to read until close()
            raise
        return self

    def start_valkey(self):
        self.valkey.start()
        wait_for("valkey", lambda: self.redis("PING") is True, proc=self.valkey.proc, log=self.valkey.log)

    def start_bridge(self):
        self.bridge.start()
        wait_for("bridge", lambda: request(self.health_port, "/healthz", timeout=1)[0] == 200,
                 proc=self.bridge.proc, log=self.bridge.log)

    def redis(self, *args):
        """One command to the stack's Valkey (`redis_command`)."""
        return redis_command(self.redis_port, *args)

    def reconfigure(self, plugin):
        """A reloadable stack's gateways load `plugin` as Envoy's file-based discovery
        delivers it (the file replaced, as Envoy watches it); returns once every gateway
        has applied it."""
        for i, path in enumerate(self.filter_files):
            before = self.reloads(i)
            config = envoy_config(plugin, self.ports[i], self.admin_ports[i], self.bridge_port)
            wasm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
                "typed_config"]["http_filters"][0]
            fresh = path.with_suffix(".new")
            fresh.write_text(json.dumps(filter_resource(wasm)))
            os.replace(fresh, path)
            wait_for(f"envoy-{i} reload", lambda i=i: self.reloads(i) > before, timeout=10)
        self.plugin = plugin

    def reloads(self, gateway):
        """How many filter configurations the gateway applied from its discovery file."""
        status, _, body = request(self.admin_ports[gateway], "/stats?filter=config_reload$",
                                  timeout=5)
        return sum(int(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                   if status == 200 and "extension_config_discovery" in line)

    def get(self, gateway=0, path="/", headers=None, **kw):
        return request(self.ports[gateway], path, headers, **kw)

    def stream(self, gateway=0, path="/v1/chat/completions", body=None, headers=None, **kw):
        """A request through a gateway, its response read as it arrives (`client.stream`)."""
        return stream(self.ports[gateway], path, body, headers, **kw)

    def stats(self, gateway=0):
        """The filter's counters on one gateway: {"allowed": 3, "callouts": 3, ...}. The
        filter counts in wasm memory and hands the counts to Envoy on its tick (at most
        every 100 ms), so this first waits out three ticks."""
        time.sleep(0.3)
        return filter_counters(self.admin_ports[gateway])

    def logs(self, name):
        proc = {"valkey": self.valkey, "bridge": self.bridge}.get(name) or \
            self.envoys[int(name.split("-")[1])]
        return Path(proc.log).read_text(errors="replace")

    def stop(self):
        for p in [*self.envoys, self.bridge, self.valkey]:
            p.stop()

    def close(self):
        self.stop()
        if self.own_workdir and os.environ.get("RATELIMIT_KEEP_LOGS") is None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def main():
    stack = Stack(gateways=2).start()
    print(f"valkey   redis://127.0.0.1:{stack.redis_port}")
    print(f"bridge   http://127.0.0.1:{stack.bridge_port}  (GET /healthz)")
    for i, (port, admin) in enumerate(zip(stack.ports, stack.admin_ports)):
        print(f"gateway {i} http://127.0.0.1:{port}  (admin :{admin})")
    print(f"logs in {stack.workdir}")
    print(f"try: curl -i -H 'x-user-id: alice' http://127.0.0.1:{stack.ports[0]}/api/profile")
    print("Ctrl-C stops everything.")
    # Ctrl-C even when started as a background job (which inherits SIGINT ignored);
    # SIGTERM and SIGHUP leave through `finally` as well.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
    try:
        while all(p.proc.poll() is None for p in [stack.valkey, stack.bridge, *stack.envoys]):
            time.sleep(0.5)
        print("a process exited; stopping", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stack.close()


if __name__ == "__main__":
    main()
