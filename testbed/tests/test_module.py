"""The dynamic module build (dist/libratelimit.so) on its own: what only it has. A panic in
a hook is caught (dynmod/src/guard.rs): its request fails per the failure mode, and the
worker, Envoy and every other request go on. The test build of the module
(`--features planted-panic`, target/planted/module/) panics on a request header."""

import json
from pathlib import Path

import pytest

from testbed.stack import ROOT, Stack, default_plugin, module_filter

PLANTED = ROOT / "target" / "planted" / "module"


def module_stack(plugin):
    """One gateway loading the planted module with `plugin`."""
    assert (PLANTED / "libratelimit.so").exists(), "build it: make test-module"
    stack = Stack(plugin, gateways=1)
    path = Path(stack.workdir) / "envoy-0.json"
    config = json.loads(path.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["http_filters"][0] = module_filter(plugin)
    path.write_text(json.dumps(config))
    stack.envoys[0].env = {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(PLANTED)}
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
