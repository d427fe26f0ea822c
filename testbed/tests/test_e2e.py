"""End to end: the real ratelimit.wasm in real Envoy, the real bridge, a real Valkey."""

import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.netem import FaultProxy
from testbed.plugins import plugin, rule
from testbed.stack import BRIDGE, FILTER, bucket_units, load_error, request, wait_for

def statuses(stack, n, gateway=0, path="/api/x", headers=None, **kw):
    return [stack.get(gateway, path, headers, **kw)[0] for _ in range(n)]


def test_a_user_gets_exactly_burst_requests_then_429_with_headers_and_body(stack_of):
    stack = stack_of(plugin(rule("per-user", ["user"], 5)))
    alice = {"x-user-id": "alice"}
    for left in range(4, -1, -1):
        status, headers, _ = stack.get(0, "/api/profile", alice)
        assert status == 200
        assert headers["x-ratelimit-limit"] == "5"
        assert headers["x-ratelimit-remaining"] == str(left)
    before = time.time()
    status, headers, body = stack.get(0, "/api/profile", alice)
    assert status == 429
    assert headers["x-ratelimit-limit"] == "5"
    assert headers["x-ratelimit-remaining"] == "0"
    # Full again in one hour; one token back in 720 s.
    assert before + 3500 < int(headers["x-ratelimit-reset"]) <= before + 3602
    assert 700 < int(headers["retry-after"]) <= 720
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "error": "Rate limit exceeded",
        "message": "You have exceeded the rate limit of 5 requests per hour. "
                   f"Try again in {headers['retry-after']} seconds.",
    }
    # Someone else is not affected.
    assert stack.get(0, "/api/profile", {"x-user-id": "bob"})[0] == 200


def test_two_gateways_share_one_bucket(stack_of):
    stack = stack_of(plugin(rule("per-user", ["user"], 20)), gateways=2)
    # Each gateway connected to the bridge first (another user's bucket), so neither
    # spends the race opening its stream while the other takes every token.
    assert [stack.get(g, "/api/feed", {"x-user-id": "warm"})[0] for g in (0, 1)] == [200, 200]
    admitted = [0, 0]
    lock = threading.Lock()

    def client(gateway):
        for _ in range(30):
            status = stack.get(gateway, "/api/feed", {"x-user-id": "shared"})[0]
            assert status in (200, 429)
            if status == 200:
                with lock:
                    admitted[gateway] += 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client, [0, 1, 0, 1]))
    print(f"admitted per gateway: {admitted}, total {sum(admitted)} of 120 sent, limit 20")
    assert sum(admitted) == 20
    assert all(a > 0 for a in admitted), "both gateways served the shared user"


def test_per_endpoint_and_global_rules(stack_of):
    stack = stack_of(plugin(
        rule("search-per-ip", ["ip"], 3, match={"path_prefix": "/api/search", "methods": ["GET"]}),
        rule("global", [], 8),
    ))
    assert statuses(stack, 3, path="/api/search?q=a") == [200] * 3
    status, headers, _ = stack.get(0, "/api/search?q=b")
    assert (status, headers["x-ratelimit-limit"]) == (429, "3")
    # Other endpoints and methods only count against the global rule (3 used so far).
    assert stack.get(0, "/api/search", method="POST")[0] == 200
    assert statuses(stack, 4, path="/api/profile") == [200] * 4
    status, headers, _ = stack.get(0, "/api/profile")
    assert (status, headers["x-ratelimit-limit"]) == (429, "8")


def test_the_most_restrictive_rule_decides(stack_of):
    stack = stack_of(plugin(rule("per-user", ["user"], 100), rule("per-ip", ["ip"], 3)))
    alice = {"x-user-id": "alice"}
    status, headers, _ = stack.get(0, "/api/a", alice, source="127.0.0.5")
    # Allowed: the rule with the fewest tokens left is shown.
    assert (status, headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == (200, "3", "2")
    assert statuses(stack, 2, headers=alice, source="127.0.0.5") == [200, 200]
    # Alice has 97 of her 100 left, but her IP reached its 3: blocked.
    status, headers, _ = stack.get(0, "/api/a", alice, source="127.0.0.5")
    assert (status, headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == (429, "3", "0")
    # The denied request took nothing from her user bucket (all-or-nothing).
    status, headers, _ = stack.get(0, "/api/a", alice, source="127.0.0.6")
    assert (status, headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == (200, "3", "2")
    units = bucket_units(stack.redis_port, "rl:per-user:alice")
    assert units // 36000 == 96  # 100 per hour: one token is 36000 units


def test_api_key_rule_with_cost(stack_of):
    stack = stack_of(plugin(rule("uploads", ["api_key"], 50, cost=5)))
    key = {"x-api-key": "k-123"}
    for left in range(45, -1, -5):
        status, headers, _ = stack.get(0, "/upload", key)
        assert (status, headers["x-ratelimit-remaining"]) == (200, str(left))
    status, headers, _ = stack.get(0, "/upload", key)
    assert status == 429
    # 5 tokens at 50 per hour: 360 s.
    assert 350 < int(headers["retry-after"]) <= 360
    # Without the identity the rule does not apply.
    assert stack.get(0, "/upload")[0] == 200


def test_ip_rule_limits_each_address_separately(stack_of):
    stack = stack_of(plugin(rule("per-ip", ["ip"], 2)))
    assert statuses(stack, 3, source="127.0.0.2") == [200, 200, 429]
    assert statuses(stack, 2, source="127.0.0.3") == [200, 200]
    # A spoofed X-Forwarded-For does not move the peer address.
    assert stack.get(0, "/", {"x-forwarded-for": "9.9.9.9"}, source="127.0.0.2")[0] == 429


def test_premium_tier_gets_its_own_limit(stack_of):
    stack = stack_of(plugin(rule("per-user", ["user"], 2, tiers={"premium": {"requests": 20, "per": "1h"}})))
    assert statuses(stack, 3, headers={"x-user-id": "basic"}) == [200, 200, 429]
    status, headers, _ = stack.get(0, "/", {"x-user-id": "rich", "x-tier": "premium"})
    assert (status, headers["x-ratelimit-limit"]) == (200, "20")


def test_a_bad_plugin_config_is_refused_naming_the_field():
    bad = plugin(rule("per-user", ["user"], 5, per="soon"))
    assert "rules[0].limit.per" in load_error(bad)


@pytest.mark.parametrize("requests", ["10", 10.5, -1, [10]])
def test_check_config_prints_the_line_the_gateway_logs_when_it_refuses_a_configuration(
        tmp_path, requests):
    bad = plugin(rule("per-user", ["user"], requests))
    path = tmp_path / "plugin.json"
    path.write_text(json.dumps(bad))
    checked = subprocess.run([BRIDGE, "check-config", str(path)], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 1
    line = checked.stderr.strip().split(f"{path}: ", 1)[1]
    assert line.startswith("invalid plugin configuration: rules[0].limit.requests: "), line
    # Envoy logs the same words (a static bootstrap then exits), in the configuration's
    # terms, not the parser's.
    assert line in load_error(bad)
    assert not any(word in line for word in ("u64", "u32", "sequence", "struct")), line
    good = tmp_path / "good.json"
    good.write_text(json.dumps(plugin(rule("per-user", ["user"], 10))))
    checked = subprocess.run([BRIDGE, "check-config", str(good)], capture_output=True,
                             text=True, timeout=30)
    assert (checked.returncode, checked.stdout) == (0, f"{good}: configured 1 rule(s)\n")


def blackhole(port):
    """A TCP server on `port` that accepts and never answers: a Redis that hangs."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return server, held


@pytest.mark.parametrize("mode,expected", [("closed", 503), ("open", 200)])
@pytest.mark.parametrize("fault", ["redis-stopped", "bridge-stopped", "redis-hangs"])
def test_failure_mode_applies_without_hanging(stack_of, mode, expected, fault):
    stack = stack_of(plugin(rule("per-user", ["user"], 100), failure_mode=mode, timeout_ms=300))
    user = {"x-user-id": "u"}
    assert stack.get(0, "/", user)[0] == 200
    hole = None
    if fault == "bridge-stopped":
        stack.bridge.stop()
    else:
        stack.valkey.stop()
        if fault == "redis-hangs":
            hole = blackhole(stack.redis_port)
    try:
        for _ in range(3):
            started = time.monotonic()
            status, headers, _ = stack.get(0, "/", user, timeout=10)
            elapsed = time.monotonic() - started
            assert status == expected, fault
            assert elapsed < 3, f"request took {elapsed:.1f}s"
            if mode == "closed":
                assert headers["retry-after"] == "1"
            else:
                assert "x-ratelimit-limit" not in headers
    finally:
        if hole:
            hole[0].close()
            for conn in hole[1]:
                conn.close()
    # The backend comes back: limiting resumes by itself.
    if fault == "bridge-stopped":
        stack.start_bridge()
    else:
        stack.start_valkey()
    wait_for("limiting to resume",
             lambda: "x-ratelimit-limit" in stack.get(0, "/", user)[1], timeout=20)


def test_local_failure_mode_keeps_each_gateway_within_its_share(stack_of):
    breaker = {"failures": 3, "open_ms": 200, "max_open_ms": 1000}
    stack = stack_of(plugin(rule("per-user", ["user"], 20), failure_mode="local", local_share=0.25,
                            timeout_ms=300, circuit_breaker=breaker), gateways=2)
    user = {"x-user-id": "carol"}
    assert [stack.get(g, "/", user)[0] for g in (0, 1)] == [200, 200]
    stack.valkey.stop()
    # Redis is gone: each gateway admits its quarter of the burst of 20, no more.
    admitted = [statuses(stack, 12, gateway=g, headers=user).count(200) for g in (0, 1)]
    print(f"admitted per gateway while Redis was down: {admitted} (share 0.25 of 20)")
    assert admitted == [5, 5]
    stack.start_valkey()
    # Redis is back (empty): global limiting resumes, 20 across both gateways for a new user.
    fresh = {"x-user-id": "dave"}
    # Each gateway's breaker closes on its own next probe.
    for g in (0, 1):
        probe = {"x-user-id": f"probe{g}"}
        wait_for(f"gateway {g} to resume global limiting",
                 lambda: stack.get(g, "/", probe)[1].get("x-ratelimit-remaining") == "19", timeout=20)
    results = [stack.get(n % 2, "/", fresh)[0] for n in range(30)]
    assert results.count(200) == 20


def test_a_gateway_recovers_within_about_a_second_of_redis_answering_again(stack_of):
    """The default breaker probes every open_ms (1 s) however long the outage: it used to
    double the interval up to 30 s, and a gateway kept failing for 21 s after Redis was
    back."""
    stack = stack_of(plugin(rule("per-user", ["user"], 1000), timeout_ms=300))
    user = {"x-user-id": "outage"}
    assert stack.get(0, "/", user)[0] == 200
    stack.valkey.stop()
    down_until = time.monotonic() + 10
    while time.monotonic() < down_until:
        assert stack.get(0, "/", user)[0] == 503
        time.sleep(0.05)
    stack.start_valkey()
    back = time.monotonic()
    while stack.get(0, "/", user)[0] != 200:
        assert time.monotonic() - back < 10, "never recovered"
        time.sleep(0.02)
    recovery = time.monotonic() - back
    print(f"answered 200 again {recovery:.2f}s after Redis did")
    assert recovery < 2.5


def test_an_open_breaker_answers_at_once_without_calling_out(stack_of):
    breaker = {"failures": 3, "open_ms": 60000, "max_open_ms": 60000}
    stack = stack_of(plugin(rule("per-user", ["user"], 100), timeout_ms=1000, circuit_breaker=breaker))
    user = {"x-user-id": "u"}
    stack.valkey.stop()
    hole = blackhole(stack.redis_port)
    try:
        for _ in range(3):  # each waits out the callout timeout
            assert stack.get(0, "/", user)[0] == 503
        before = stack.stats()
        started = time.monotonic()
        assert statuses(stack, 20, headers=user) == [503] * 20
        elapsed = time.monotonic() - started
        after = stack.stats()
    finally:
        hole[0].close()
        for conn in hole[1]:
            conn.close()
    sent = lambda s: s.get("callouts", 0) + s.get("stream_messages", 0)  # noqa: E731
    assert sent(after) == sent(before), "nothing sent while the breaker is open"
    assert after["short_circuits"] - before["short_circuits"] == 20
    assert before["backend_failures"] == 3
    # 20 requests in less than the time of a single timed-out callout.
    assert elapsed < 1.0, f"{elapsed:.2f}s"


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_group_commit_stays_exact_across_two_gateways(stack_of, transport):
    """Group commit is on by default (max_inflight 1): checks that arrive while exchanges
    are out leave together in the next one. Fewer exchanges than checks, the same exact
    total, on the gRPC stream (the default) and over HTTP callouts. (Without the deny
    cache, so that every request is a check.) The dynamic module carries batches as
    callouts whatever the transport (Envoy gives it no stream a worker keeps)."""
    config = plugin(rule("per-user", ["user"], 40), deny_cache_entries=0)
    config["backend"]["transport"] = transport
    stack = stack_of(config, gateways=2)
    results = []
    lock = threading.Lock()

    def client(gateway):
        for _ in range(15):
            status = stack.get(gateway, "/api/feed", {"x-user-id": "batched"})[0]
            with lock:
                results.append(status)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, [0, 1] * 8))
    assert sorted(set(results)) == [200, 429]
    assert results.count(200) == 40
    stats = [stack.stats(g) for g in (0, 1)]
    via = "callouts" if transport == "http" or FILTER == "module" else "stream_messages"
    exchanges = sum(s.get(via, 0) for s in stats)
    checks = sum(s["allowed"] + s["denied"] for s in stats)
    print(f"{checks} checks in {exchanges} {via}")
    assert checks == 240
    assert sum(s["checks_sent"] for s in stats) == 240
    assert exchanges < checks


def test_a_bridge_restart_fails_only_what_was_out_and_the_stream_comes_back(stack_of):
    """The stream dies with the bridge: checks sent meanwhile get the failure mode at once
    (no hang until a timeout), and the worker reopens the stream by itself once the bridge
    is back, with the buckets (in Valkey) intact."""
    stack = stack_of(plugin(rule("per-user", ["user"], 5), failure_mode="open",
                            circuit_breaker={"failures": 0}))
    bob = {"x-user-id": "bob"}
    assert statuses(stack, 3, headers=bob) == [200] * 3
    stack.bridge.stop()
    started = time.monotonic()
    # failure_mode open: admitted without limit while the bridge is away, quickly.
    assert statuses(stack, 10, headers=bob) == [200] * 10
    assert time.monotonic() - started < 5
    stack.start_bridge()
    # Reopened with backoff (at most 5 s between tries); then exact again: 2 of 5 left.
    wait_for("limiting to resume", lambda: stack.get(0, "/api/x", bob)[1].get(
        "x-ratelimit-remaining") is not None, timeout=20)
    assert statuses(stack, 5, headers=bob) == [200] * 1 + [429] * 4
    assert stack.stats()["backend_failures"] >= 10  # and the probes of wait_for


def test_a_silent_connection_to_the_bridge_is_replaced(stack_of):
    """A connection to the bridge that goes silent (a NAT or load balancer on the way forgot
    it; nothing is closed or reset) holds every check until it times out into the failure
    mode; envoy.yaml's HTTP/2 keepalive finds it dead (a PING unanswered) and a new one
    takes the checks, within its interval and timeout (5 s and 2 s)."""
    with FaultProxy(0) as proxy:
        stack = stack_of(plugin(rule("per-user", ["user"], 1000), timeout_ms=200),
                         gateways=1, bridge_via=proxy.port)
        # Retargeted once the bridge has a port: a connection tried before fails, and the
        # gateway's next one reaches it.
        proxy.retarget(stack.bridge_port)
        wait_for("a check through the proxy",
                 lambda: stack.get(0, "/api/x", {"x-user-id": "gina"})[0] == 200, timeout=15)
        proxy.silence()
        silent = time.monotonic()
        statuses = []
        while time.monotonic() - silent < 30:
            statuses.append(stack.get(0, "/api/x", {"x-user-id": "gina"}, timeout=5)[0])
            if statuses[-1] == 200:
                break
            time.sleep(0.1)
        took = time.monotonic() - silent
        print(f"checks while silent: {statuses}, back after {took:.1f} s")
        assert statuses[0] != 200, "the silent connection held the first check"
        assert statuses[-1] == 200 and took < 5 + 2 + 5, f"not replaced after {took:.1f} s"
