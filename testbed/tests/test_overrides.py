"""End to end, as an operator uses them: emergency overrides set with the bridge's command
line reach two real Envoy gateways within a second and expire by themselves, leaving the
client where its rule would; `usage` reads a client's bucket as the gateways see it; a
block is lifted on every gateway within a second; every admin endpoint wants the
operators' secret (`--admin-token-file`), never the gateways' token.

Most buckets counted under an override whose rate differs from the rule's are fresh ones
(clients that made no request before); `test_an_override_on_a_client_in_use_keeps_its_tokens`
is the one that counts on the script rescaling a stored level to a changed rate."""

import http.client
import json
import subprocess
import time

import pytest

from testbed.cluster import ValkeyCluster
from testbed.plugins import plugin, rule
from testbed.stack import BRIDGE, Process, free_port, request, wait_for

TOKEN = "gateways-s3cret"
ADMIN_TOKEN = "operators-s3cret"
# The bridge reads overrides every 250 ms: within a second is the documented bound, 1.5 s
# leaves room for a loaded machine without making the test meaningless.
WITHIN = 1.5


def start(stack_of, tmp_path, *rules):
    """Two gateways sharing one bridge that holds both tokens and the plugin configuration."""
    config = plugin(*rules)
    config["backend"]["token"] = TOKEN
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
    (tmp_path / "plugin.json").write_text(json.dumps(config))
    stack = stack_of(config, gateways=2, bridge_args=[
        "--token-file", str(tmp_path / "token"),
        "--admin-token-file", str(tmp_path / "admin-token"),
        "--config", str(tmp_path / "plugin.json")])
    stack.plugin_file = tmp_path / "plugin.json"
    return stack


def bridge(stack, *args, stdin=None, ok=True):
    """`ratelimit-bridge ARGS` on the stack's Valkey (or Cluster), `stdin` its input: its
    JSON output, or (`ok` false: it must fail) what it said on stderr."""
    done = subprocess.run([BRIDGE, *args, *stack.redis_args], capture_output=True, text=True,
                          timeout=60, input=stdin)
    assert (done.returncode == 0) == ok, done.stderr
    return json.loads(done.stdout) if ok else done.stderr


def admitted(stack, user, n, path="/api/x"):
    """Sends `n` requests as `user`, alternating the two gateways; admitted per gateway."""
    per_gateway = [0, 0]
    for i in range(n):
        status = stack.get(i % 2, path, {"x-user-id": user})[0]
        assert status in (200, 429), status
        per_gateway[i % 2] += status == 200
    return per_gateway


def until(what, condition, deadline):
    """Polls `condition` until `deadline` (monotonic); fails naming `what` past it."""
    while True:
        if condition():
            return time.monotonic()
        assert time.monotonic() < deadline, f"{what} not seen in time"
        time.sleep(0.05)


# A rule of its own path, for `applied` to probe: fresh clients on it are checked against
# it (and against the rule every test has, which admits them).
PROBE = rule("probe", ["user"], 10, match={"path_prefix": "/probe"})


def applied(stack):
    """Writes a rule-wide override of `PROBE` (1 an hour), after the overrides the test
    wrote, and waits until the bridge applies it to a fresh client. The bridge reads a
    prefix's overrides whole (one ZRANGE of their index), so those written before are
    applied as well."""
    bridge(stack, "override", "set", "--rule", "probe", "--requests", "1", "--per", "1h",
           "--ttl", "1m")
    probe = fresh_clients("probe-rule")
    # Under the rule a fresh client is admitted twice, under the override once.
    until("the probe's override", lambda: sum(admitted(stack, probe(), 2, "/probe")) == 1,
          time.monotonic() + 20)


def fresh_clients(prefix):
    n = 0

    def next_client():
        nonlocal n
        n += 1
        return f"{prefix}-{n}"
    return next_client


def test_an_override_reaches_both_gateways_within_a_second_and_expires_on_time(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 3))
    assert admitted(stack, "before", 6) == [2, 1]
    probe = fresh_clients("probe")
    asked = time.monotonic()
    bridge(stack, "override", "set", "--rule", "per-user", "--requests", "10", "--per", "1h",
           "--ttl", "3s")
    written = time.monotonic()
    # A fresh client admitted a 4th time: the override (10) is applied, not the rule (3).
    until("the override", lambda: sum(admitted(stack, probe(), 4)) == 4, written + WITHIN)
    assert admitted(stack, "carol", 12) == [5, 5], "both gateways apply the same 10"
    # The headers are the override's bucket: its size and what is left of it.
    status, headers, _ = stack.get(0, "/api/x", {"x-user-id": "dave"})
    assert (status, headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == \
        (200, "10", "9")
    [active] = bridge(stack, "override", "list")
    assert (active["key"], active["scope"], active["burst"]) == ("rl:per-user", "rule", 10)
    # Not before its time: 2 s after it was written (of 3), it still applies. Redis's 3 s
    # began after `asked`: only requests answered before `asked + 3` prove anything (a
    # machine so slow that they were not cannot tell, and does not fail).
    time.sleep(max(0.0, written + 2.0 - time.monotonic()))
    still = sum(admitted(stack, "erin", 4))
    assert still == 4 or time.monotonic() >= asked + 3, f"{still} of 4 before its expiry"
    # Redis expires it at 3 s; every bridge drops it within a second after.
    until("the expiry", lambda: sum(admitted(stack, probe(), 4)) == 3, written + 3 + WITHIN)
    assert admitted(stack, "frank", 6) == [2, 1]
    assert bridge(stack, "override", "list") == []


def test_a_client_override_wins_over_its_rules_and_clearing_takes_effect(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 10))
    probe = fresh_clients("probe")
    bridge(stack, "override", "set", "--rule", "per-user", "--value", "alice",
           "--requests", "2", "--per", "1h", "--ttl", "1m")
    bridge(stack, "override", "set", "--rule", "per-user", "--requests", "5", "--per", "1h",
           "--ttl", "1m")
    written = time.monotonic()
    # The rule-wide override was written last: once it is seen, so is alice's.
    until("the overrides", lambda: sum(admitted(stack, probe(), 6)) == 5, written + WITHIN)
    assert sum(admitted(stack, "alice", 4)) == 2, "alice's own override wins"
    assert sum(admitted(stack, "bob", 7)) == 5, "everyone else: the rule-wide override"
    assert len(bridge(stack, "override", "list")) == 2
    cleared = bridge(stack, "override", "clear", "--rule", "per-user")
    assert cleared == {"key": "rl:per-user", "cleared": True}
    gone = time.monotonic()
    until("the rule back", lambda: sum(admitted(stack, probe(), 6)) == 6, gone + WITHIN)
    assert sum(admitted(stack, "carol", 11)) == 10
    [left] = bridge(stack, "override", "list")
    assert left["key"] == "rl:per-user:alice"


def test_usage_shows_what_the_next_request_shows_plus_one(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 5))
    # A value the gateway escapes: the operator types it as the client sent it.
    user = "Al ice/{x}"
    for gateway in (0, 1):
        assert stack.get(gateway, "/api/x", {"x-user-id": user})[0] == 200
    usage = bridge(stack, "usage", "--config", str(stack.plugin_file), "--rule", "per-user",
                   "--value", user)
    assert usage["key"] == "rl:per-user:Al%20ice%2F%7Bx%7D"
    assert (usage["limit"], usage["remaining"], usage["override"], usage["blocked"]) == \
        (5, 3, None, None)
    status, headers, _ = stack.get(1, "/api/x", {"x-user-id": user})
    assert status == 200
    assert int(headers["x-ratelimit-remaining"]) + 1 == usage["remaining"]
    # One more token taken: full again one token's refill later (720 s at 5 per hour).
    assert 719 <= int(headers["x-ratelimit-reset"]) - usage["reset"] <= 722
    # Reading usage took nothing: the same again over HTTP, one token less than before.
    again = admin(stack, "GET", "/admin/usage?rule=per-user&value=Al+ice%2F%7Bx%7D")
    assert again[0] == 200
    assert json.loads(again[1])["remaining"] == usage["remaining"] - 1
    # An override shows in the usage of the clients it covers.
    bridge(stack, "override", "set", "--rule", "per-user", "--value", user, "--requests", "5",
           "--per", "1h", "--burst", "8", "--ttl", "1m")
    usage = bridge(stack, "usage", "--config", str(stack.plugin_file), "--rule", "per-user",
                   "--value", user)
    assert (usage["limit"], usage["override"]["scope"], usage["override"]["burst"]) == \
        (8, "client", 8)


def test_an_override_on_a_client_in_use_keeps_its_tokens(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 10), PROBE)
    assert admitted(stack, "bob", 3) == [2, 1]
    bridge(stack, "override", "set", "--rule", "per-user", "--value", "bob", "--requests", "4",
           "--per", "1h", "--ttl", "1m")
    applied(stack)
    # bob had 7 of 10 at 10 per hour: under 4 per hour (another rate, so other units) he
    # has 4, the new burst, not 7 read in the wrong units (17) nor a fresh bucket.
    assert admitted(stack, "bob", 6) == [2, 2]
    usage = bridge(stack, "usage", "--config", str(stack.plugin_file), "--rule", "per-user",
                   "--value", "bob")
    assert (usage["limit"], usage["remaining"]) == (4, 0)


def test_an_override_that_expires_leaves_the_client_its_own_tokens(stack_of, tmp_path):
    # Issue 22 row 10: 100 an hour; alice sends 3; 2 an hour for 4 s; she sends 4 more
    # (2 admitted); once it expires she has 100 - 3 - 2 left, not the override's 0.
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 100), PROBE)
    assert admitted(stack, "alice", 3) == [2, 1]
    bridge(stack, "override", "set", "--rule", "per-user", "--value", "alice",
           "--requests", "2", "--per", "1h", "--ttl", "4s")
    written = time.monotonic()
    applied(stack)
    assert sum(admitted(stack, "alice", 4)) == 2
    usage = ["usage", "--config", str(stack.plugin_file), "--rule", "per-user",
             "--value", "alice"]
    assert (bridge(stack, *usage)["remaining"], bridge(stack, *usage)["limit"]) == (0, 2)
    # Its 4 s run out (Redis counts them from before `written`), then read until it is gone.
    time.sleep(max(0.0, written + 4.0 - time.monotonic()))
    until("the override's end", lambda: bridge(stack, *usage)["override"] is None,
          written + 4 + WITHIN)
    assert bridge(stack, *usage)["remaining"] == 95
    # Her next request is admitted on either gateway once the bridges dropped it (the
    # gateways cached her denials no longer than the override's end).
    until("alice admitted", lambda: stack.get(0, "/api/x", {"x-user-id": "alice"})[0] == 200,
          written + 4 + 2 * WITHIN)
    assert stack.get(1, "/api/x", {"x-user-id": "alice"})[0] == 200
    assert bridge(stack, *usage)["remaining"] == 93


def spoof_until_blocked(stack, victim):
    """Sends requests as `victim` (a header anyone can write) alternating the gateways
    until one is refused as blocked, then one more on the other gateway; both replies."""
    for i in range(50):
        status, headers, body = stack.get(i % 2, "/api/x", victim)
        if status == 429 and json.loads(body)["error"] == "Blocked":
            return (status, headers, body), stack.get(1 - i % 2, "/api/x", victim)
        assert status in (200, 429), status
    raise AssertionError("never blocked")


def blocked_everywhere(stack, victim):
    """The victim is refused as blocked on both gateways, with the hour's Retry-After."""
    for gateway in (0, 1):
        status, headers, body = stack.get(gateway, "/api/x", victim)
        assert (status, json.loads(body)["error"]) == (429, "Blocked"), (gateway, body)
        assert 3500 <= int(headers["retry-after"]) <= 3600, headers


def admitted_everywhere_within(stack, victim, since, seconds):
    """Polls each gateway until it admits `victim`; fails past `since + seconds`."""
    for gateway in (0, 1):
        until(f"gateway {gateway} admitting", lambda: stack.get(gateway, "/api/x", victim)[0]
              == 200, since + seconds)


# A rule whose bucket refills within a second (2 a second), blocking for an hour after 2
# denials within a minute: once lifted, only the block could still refuse the victim.
SPOOFABLE = rule("per-user", ["user"], 2, per="1s",
                 block={"after": 2, "within": "1m", "for": "1h"})


def test_a_block_lifted_with_unblock_reaches_both_gateways_within_a_second(stack_of, tmp_path):
    # Issue 22 row 5: a spoofer writes the victim's x-user-id; the victim is then blocked
    # everywhere for an hour, until the operator lifts it.
    stack = start(stack_of, tmp_path, SPOOFABLE)
    victim = {"x-user-id": "victim"}
    for status, headers, _ in spoof_until_blocked(stack, victim):
        assert status == 429 and 3500 <= int(headers["retry-after"]) <= 3600
    # Still blocked after the gateways' caches let go (a second) and the bucket refilled.
    time.sleep(1.5)
    blocked_everywhere(stack, victim)
    assert bridge(stack, "unblock", "--rule", "per-user", "--value", "victim") == \
        {"key": "rl:per-user:victim", "unblocked": True}
    lifted = time.monotonic()
    admitted_everywhere_within(stack, victim, lifted, 2.5)
    # Lifting it again finds nothing to lift.
    assert bridge(stack, "unblock", "--rule", "per-user", "--value", "victim")["unblocked"] \
        is False


def test_a_block_lifted_over_http_or_by_deleting_the_bucket_reaches_both_gateways(
        stack_of, tmp_path):
    stack = start(stack_of, tmp_path, SPOOFABLE)
    for who, lift in [("victim", "http"), ("other", "del")]:
        victim = {"x-user-id": who}
        spoof_until_blocked(stack, victim)
        # Past the gateways' caches (a second) and the bucket's refill: only the block refuses.
        time.sleep(1.2)
        blocked_everywhere(stack, victim)
        if lift == "http":
            status, body = admin(stack, "DELETE", f"/admin/blocks?rule=per-user&value={who}")
            assert (status, json.loads(body)["unblocked"]) == (200, True), body
        else:
            assert stack.redis("DEL", f"rl:per-user:{who}") == 1
        lifted = time.monotonic()
        admitted_everywhere_within(stack, victim, lifted, 2.5)


def test_usage_shows_a_block(stack_of, tmp_path):
    block = {"after": 1, "within": "1m", "for": "1m"}
    stack = start(stack_of, tmp_path, rule("login", ["user"], 2, block=block))
    query = ["usage", "--config", str(stack.plugin_file), "--rule", "login", "--value", "eve"]
    assert bridge(stack, *query)["blocked"] is None
    assert [stack.get(0, "/", {"x-user-id": "eve"})[0] for _ in range(3)] == [200, 200, 429]
    usage = bridge(stack, *query)
    assert usage["remaining"] == 0
    assert 55 <= usage["blocked"]["until"] - time.time() <= 61
    # Reading it again counted no denial: the block ends when it did.
    assert bridge(stack, *query)["blocked"] == usage["blocked"]


def admin(stack, method, path, token=ADMIN_TOKEN, port=None):
    conn = http.client.HTTPConnection("127.0.0.1", port or stack.bridge_port, timeout=10)
    try:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


ADMIN_CALLS = [
    ("GET", "/admin/overrides"),
    ("PUT", "/admin/overrides?rule=per-user&value=mallory&requests=1000&per=1s&ttl=1h"),
    ("DELETE", "/admin/overrides?rule=per-user"),
    ("GET", "/admin/usage?rule=per-user&value=alice"),
    ("DELETE", "/admin/blocks?rule=per-user&value=alice"),
    ("POST", "/admin/overrides"),
    ("GET", "/admin/anything"),
]


def test_every_admin_call_without_the_secret_is_refused(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 3))
    for method, path in ADMIN_CALLS:
        # The gateways' token first: every gateway holds it (Envoy's /config_dump shows it).
        for token in (TOKEN, None, "wrong", ADMIN_TOKEN + "x", ADMIN_TOKEN.upper()):
            status, _ = admin(stack, method, path, token=token)
            assert status == 401, (method, path, token)
    # Nor does the operators' secret check anything.
    assert admin(stack, "POST", "/v1/check", token=ADMIN_TOKEN)[0] == 401
    assert stack.redis("KEYS", "*") == [], "refused calls touched nothing"
    # With the token the same calls are served: the override set over HTTP applies.
    assert admin(stack, *ADMIN_CALLS[1])[0] == 200
    [active] = json.loads(admin(stack, "GET", "/admin/overrides")[1])
    assert (active["key"], active["requests"], active["per_ms"]) == \
        ("rl:per-user:mallory", 1000, 1000)
    assert admin(stack, "GET", "/admin/usage?rule=per-user&value=alice")[0] == 200
    assert admin(stack, "PUT", "/admin/overrides?rule=per-user&requests=0&per=1s&ttl=1h")[0] == 400
    assert admin(stack, "POST", "/admin/overrides")[0] == 405
    assert admin(stack, "GET", "/admin/anything")[0] == 404
    cleared = admin(stack, "DELETE", "/admin/overrides?rule=per-user&value=mallory")
    assert (cleared[0], json.loads(cleared[1])["cleared"]) == (200, True)


def test_a_bridge_without_an_admin_token_file_serves_no_admin_endpoint(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 3))
    port = free_port()
    gateways_only = Process("gateways-only-bridge", [
        BRIDGE, "--listen", f"127.0.0.1:{port}", "--redis",
        f"redis://127.0.0.1:{stack.redis_port}", "--threads", "1",
        "--token-file", str(tmp_path / "token")], str(tmp_path)).start()
    try:
        wait_for("bridge", lambda: request(port, "/healthz", timeout=1)[0] == 200,
                 proc=gateways_only.proc, log=gateways_only.log)
        for method, path in ADMIN_CALLS:
            for token in (None, TOKEN, ADMIN_TOKEN):
                assert admin(stack, method, path, token=token, port=port)[0] == 404, (method, path)
        assert stack.redis("KEYS", "*") == []
    finally:
        gateways_only.stop()


def test_overrides_and_usage_on_a_cluster(stack_of_cluster, tmp_path):
    cluster = ValkeyCluster(3, 0).start()
    try:
        config = plugin(rule("per-user", ["user"], 3))
        (tmp_path / "plugin.json").write_text(json.dumps(config))
        stack = stack_of_cluster(config, cluster)
        probe = fresh_clients("probe")
        bridge(stack, "override", "set", "--rule", "per-user", "--requests", "10",
               "--per", "1h", "--ttl", "1m")
        written = time.monotonic()
        until("the override", lambda: sum(admitted_one(stack, probe(), 4)) == 4,
              written + WITHIN)
        assert sum(admitted_one(stack, "carol", 12)) == 10
        usage = bridge(stack, "usage", "--config", str(tmp_path / "plugin.json"),
                       "--rule", "per-user", "--value", "carol")
        assert (usage["limit"], usage["remaining"]) == (10, 0)
        assert [o["key"] for o in bridge(stack, "override", "list")] == ["rl:per-user"]
    finally:
        cluster.close()


def admitted_one(stack, user, n):
    """Whether each of `n` requests as `user` to the only gateway was admitted."""
    return [stack.get(0, "/", {"x-user-id": user})[0] == 200 for _ in range(n)]


@pytest.mark.parametrize("args, complaint", [
    (["override", "set", "--rule", "a:b", "--requests", "1", "--per", "1m", "--ttl", "1m"],
     "not a name"),
    (["override", "set", "--rule", "r", "--requests", "1", "--per", "soon", "--ttl", "1m"],
     "not a duration"),
    (["override", "set", "--rule", "r", "--requests", "1", "--per", "1m", "--ttl", "0s"],
     "ttl"),
])
def test_bad_overrides_are_refused_naming_the_problem(args, complaint):
    done = subprocess.run([BRIDGE, *args, "--redis", "redis://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and complaint in done.stderr, done.stderr
