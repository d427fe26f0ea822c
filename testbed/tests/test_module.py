"""The dynamic module build (dist/libratelimit.so) on its own: what only it has.

- A panic in a hook is caught (dynmod/src/guard.rs): its request fails per the failure
  mode, and the worker, Envoy and every other request go on. The test build of the module
  (`--features planted-panic`, target/planted/) panics on a request header.
- The workers' batches travel as the transport says: on each worker's gRPC stream, which
  Envoy's main thread holds for it (dynmod/src/streams.rs), or as HTTP callouts; the bridge
  counts which it received."""

import json
import re
import signal
from pathlib import Path

import pytest

from testbed.client import request
from testbed.stack import ROOT, Stack, default_plugin, module_filter

PLANTED = ROOT / "target" / "planted"
DIST = ROOT / "dist"


def module_stack(plugin, search_path=PLANTED):
    """One gateway loading the module found in `search_path` with `plugin`."""
    assert (search_path / "libratelimit.so").exists(), "build it: make test-module"
    stack = Stack(plugin, gateways=1)
    path = Path(stack.workdir) / "envoy-0.json"
    config = json.loads(path.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["http_filters"][0] = module_filter(plugin)
    path.write_text(json.dumps(config))
    stack.envoys[0].env = {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(search_path)}
    return stack


@pytest.mark.parametrize("mode,failed", [("closed", 503), ("open", 200)])
def test_a_panic_fails_its_request_per_the_failure_mode_and_nothing_else(mode, failed):
    plugin = default_plugin()
    plugin["failure_mode"] = mode
    stack = module_stack(plugin)
    try:
        stack.start()
        user = {"x-user-id": "pat"}
        before = stack.get(0, "/api/profile", user)
        assert before[0] == 200 and before[1]["x-ratelimit-remaining"] == "99", before[:2]
        planted = stack.get(0, "/api/profile", {**user, "x-ratelimit-test-panic": "1"})
        assert planted[0] == failed, planted[:2]
        # The same worker goes on checking exactly: the panicking request took nothing.
        after = [stack.get(0, "/api/profile", user) for _ in range(3)]
        assert [r[0] for r in after] == [200] * 3
        assert [r[1]["x-ratelimit-remaining"] for r in after] == ["98", "97", "96"]
        assert stack.envoys[0].proc.poll() is None, "Envoy died"
        assert "request_headers panicked (planted by the test build)" in stack.logs("envoy-0")
    finally:
        stack.close()


def exchanges(stack):
    """The bridge's exchanges received so far, by transport: {"grpc": 3, "http": 0}."""
    _, _, body = request(stack.bridge_port, "/metrics")
    found = re.findall(r'^ratelimit_bridge_exchanges_total\{transport="(\w+)"\} (\d+)', body,
                       re.M)
    return {transport: int(n) for transport, n in found}


@pytest.mark.parametrize("transport,used,unused", [("grpc", "grpc", "http"),
                                                   ("http", "http", "grpc")])
def test_checks_travel_on_the_workers_stream_or_as_callouts_as_the_transport_says(
        transport, used, unused):
    plugin = default_plugin()
    plugin["backend"]["transport"] = transport
    stack = module_stack(plugin, DIST)
    try:
        stack.start()
        user = {"x-user-id": "sam"}
        answers = [stack.get(0, "/api/profile", user) for _ in range(5)]
        assert [a[0] for a in answers] == [200] * 5
        assert [a[1]["x-ratelimit-remaining"] for a in answers] == ["99", "98", "97", "96", "95"]
        seen = exchanges(stack)
        assert seen.get(used, 0) >= 5 and seen.get(unused, 0) == 0, seen
    finally:
        stack.close()


def test_a_stream_the_bridge_drops_fails_its_checks_per_the_failure_mode_and_is_opened_again():
    """The bridge stops answering (SIGSTOP): the checks in flight on the worker's stream
    fail closed within timeout_ms, not when Envoy would give up; the bridge is killed and
    started again on its port: the next checks open a new stream and count on."""
    plugin = default_plugin()
    plugin["failure_mode"] = "closed"
    stack = module_stack(plugin, DIST)
    try:
        stack.start()
        user = {"x-user-id": "kit"}
        assert stack.get(0, "/api/profile", user)[1]["x-ratelimit-remaining"] == "99"
        stack.bridge.proc.send_signal(signal.SIGSTOP)
        try:
            stalled = stack.get(0, "/api/profile", user, timeout=5)
        finally:
            stack.bridge.proc.send_signal(signal.SIGCONT)
        assert stalled[0] == 503, stalled[:2]
        stack.bridge.stop()
        stack.start_bridge()
        after = [stack.get(0, "/api/profile", user) for _ in range(3)]
        assert [a[0] for a in after] == [200] * 3, [a[:2] for a in after]
        # The stalled check may have reached Valkey once the bridge went on: 98 or 97 left.
        remaining = [int(a[1]["x-ratelimit-remaining"]) for a in after]
        assert remaining in ([98, 97, 96], [97, 96, 95]), remaining
        assert exchanges(stack).get("grpc", 0) >= 3
    finally:
        stack.close()
