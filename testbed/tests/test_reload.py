"""Reloading the plugin configuration without a reset, end to end: two gateways discover
the wasm filter's configuration from a file (Envoy's ECDS); replacing it changes a limit
for new requests, keeps every client's bucket (read in the new limit's units, never
refilled), and lets a request paused in the old configuration complete."""

import os
import signal
import threading

from testbed.plugins import plugin, rule


def per_user(requests, timeout_ms=1000):
    return plugin(rule("per-user", ["user"], requests, per="1m"), timeout_ms=timeout_ms)


def remaining(stack, gateway, user):
    status, headers, _ = stack.get(gateway, "/api/x", {"x-user-id": user})
    return status, headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]


def test_a_reload_changes_the_limit_and_keeps_every_bucket(stack_of):
    stack = stack_of(per_user(5), gateways=2, reloadable=True)
    for gateway in (0, 1, 0):
        remaining(stack, gateway, "alice")
    assert remaining(stack, 1, "alice") == (200, "5", "1")

    stack.reconfigure(per_user(10))
    # Alice keeps her one token (not a fresh bucket of 10); Bob starts full.
    assert remaining(stack, 0, "alice") == (200, "10", "0")
    assert remaining(stack, 1, "bob") == (200, "10", "9")
    assert remaining(stack, 1, "alice")[0] == 429

    stack.reconfigure(per_user(3))
    # Lowered: Bob's 9 tokens are at most the new burst of 3.
    assert remaining(stack, 0, "bob") == (200, "3", "2")


def test_a_request_paused_in_the_old_configuration_completes(stack_of):
    stack = stack_of(per_user(5, timeout_ms=10_000), gateways=1, reloadable=True)
    assert remaining(stack, 0, "carol")[0] == 200
    os.kill(stack.bridge.proc.pid, signal.SIGSTOP)
    answer = []
    try:
        paused = threading.Thread(
            target=lambda: answer.append(remaining(stack, 0, "carol")), daemon=True)
        paused.start()
        stack.reconfigure(per_user(20, timeout_ms=10_000))
    finally:
        os.kill(stack.bridge.proc.pid, signal.SIGCONT)
    paused.join(timeout=10)
    # Checked under the configuration it started in: the old limit of 5.
    assert answer == [(200, "5", "3")]
    assert remaining(stack, 0, "carol") == (200, "20", "2")


def test_reloads_with_requests_in_flight_leave_the_bridge_reachable(stack_of):
    """A request that outlives its configuration makes Envoy end that configuration on a
    worker; its streams to the bridge must not be torn down there, under the main thread
    that owns their connection (the module lost every later answer one reload in five)."""
    stack = stack_of(per_user(100, timeout_ms=10_000), gateways=1, reloadable=True)
    for limit in range(50, 58):
        os.kill(stack.bridge.proc.pid, signal.SIGSTOP)
        answer = []
        try:
            paused = threading.Thread(
                target=lambda: answer.append(stack.get(0, "/api/x", {"x-user-id": "dave"})[0]),
                daemon=True)
            paused.start()
            stack.reconfigure(per_user(limit, timeout_ms=10_000))
        finally:
            os.kill(stack.bridge.proc.pid, signal.SIGCONT)
        paused.join(timeout=10)
        assert answer == [200]
        status, headers, _ = stack.get(0, "/api/x", {"x-user-id": "erin"}, timeout=5)
        assert (status, headers["x-ratelimit-limit"]) == (200, str(limit))
