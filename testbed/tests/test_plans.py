"""Clients' plans (docs/plans.md) end to end, as an operator or a billing system writes them:
with the bridge's command line, a bulk import of JSON lines and the admin endpoints, each
reaching two real Envoy gateways within a second; a client's plan is its limit (its
headers say so) until cleared, on a rate rule as on a calendar quota; the bridge's metrics
count checks per plan name, never per client."""

import json
import time

from testbed.plugins import rule
from testbed.stack import request
from testbed.tests.test_overrides import ADMIN_TOKEN, WITHIN, admin, bridge, start


def admitted(stack, user, n):
    """How many of `n` requests as `user`, alternating the gateways, were admitted; the last
    response's headers."""
    allowed, headers = 0, None
    for i in range(n):
        status, headers, _ = stack.get(i % 2, "/api/x", {"x-user-id": user})
        assert status in (200, 429), status
        allowed += status == 200
    return allowed, headers


def probes(stack, count, plan, requests, rule="per-user"):
    """Imports a plan for `count` probing clients, written after every plan before it:
    once one shows, those are in force too. Their names."""
    users = [f"probe-{i}" for i in range(count)]
    rows = [{"rule": rule, "values": [u], "plan": plan, "requests": requests, "per": "1h"}
            for u in users]
    bridge(stack, "plan", "import", "-", stdin="\n".join(map(json.dumps, rows)))
    return users


def wait_for_plan(stack, users, limit, uses=2, path="/api/x"):
    """Until a request of one of `users` shows its plan's `limit`; the seconds it took.
    Each client is asked at most `uses` times, fewer than the rule admits: a client
    refused under the rule's limit would be held refused by a gateway's deny cache until
    the rule's wait is over, whatever plan came meanwhile (docs/plans.md)."""
    asked = time.monotonic()
    for user in users:
        for _ in range(uses):
            _, headers, _ = stack.get(0, path, {"x-user-id": user})
            if headers.get("x-ratelimit-limit") == str(limit):
                return time.monotonic() - asked
            assert time.monotonic() < asked + WITHIN + 1, f"a plan of {limit} not seen in time"
            time.sleep(0.05)
    raise AssertionError(f"a plan of {limit} not seen with {len(users)} probes")


def test_a_plan_set_on_the_command_line_is_the_clients_limit_on_both_gateways(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 3))
    written = bridge(stack, "plan", "set", "--rule", "per-user", "--value", "alice",
                     "--plan", "pro", "--requests", "20", "--per", "1h")
    assert (written["key"], written["plan"], written["burst"]) == ("rl:per-user:alice", "pro", 20)
    assert wait_for_plan(stack, probes(stack, 60, "pro", 20), 20) < WITHIN
    allowed, headers = admitted(stack, "alice", 24)
    assert allowed == 20, "the plan's 20 on both gateways, not the rule's 3"
    assert headers["x-ratelimit-limit"] == "20"
    assert admitted(stack, "bob", 5)[0] == 3, "a client without a plan: the rule's limit"
    _, _, metrics = request(stack.bridge_port, "/metrics")
    assert 'ratelimit_bridge_plan_checks_total{plan="pro",outcome="allowed"} ' in metrics
    assert 'ratelimit_bridge_plan_checks_total{plan="pro",outcome="denied"}' in metrics
    assert "alice" not in metrics, "never a series per client"
    assert "ratelimit_bridge_plans 61" in metrics
    listed = {p["key"]: p for p in bridge(stack, "plan", "list")}
    assert (len(listed), listed["rl:per-user:alice"]["plan"]) == (61, "pro")
    assert bridge(stack, "plan", "clear", "--rule", "per-user", "--value", "alice") == \
        {"key": "rl:per-user:alice", "cleared": True}
    deadline = time.monotonic() + WITHIN + 1
    while stack.get(1, "/api/x", {"x-user-id": "alice"})[1].get("x-ratelimit-limit") != "3":
        assert time.monotonic() < deadline, "the rule's limit back"
        time.sleep(0.05)


def test_a_bulk_import_is_checked_whole_then_written_and_applied(stack_of, tmp_path):
    stack = start(stack_of, tmp_path, rule("per-user", ["user"], 3))
    rows = [{"rule": "per-user", "values": [f"user-{i}"], "plan": "team", "requests": 7,
             "per": "1h"} for i in range(3000)]
    bad = rows[:10] + [{"rule": "per-user", "values": ["x"], "plan": "team", "requests": 0,
                        "per": "1h"}]
    said = bridge(stack, "plan", "import", "-", stdin="\n".join(map(json.dumps, bad)), ok=False)
    assert "-:11: requests" in said, said
    assert stack.redis("EXISTS", "rl:{plans}") == 0, "nothing written"
    done = bridge(stack, "plan", "import", "-", stdin="\n".join(map(json.dumps, rows)))
    assert (done["imported"], done["calls"]) == (3000, 3)
    wait_for_plan(stack, [f"user-{i}" for i in range(2999, 2900, -1)], 7)
    assert admitted(stack, "user-1234", 9)[0] == 7, "the plan's 7, not the rule's 3"


def test_the_admin_endpoints_set_and_clear_plans_with_the_operators_secret(stack_of, tmp_path):
    monthly = {"name": "monthly", "key": ["user"], "limit": {"requests": 2, "per": "month"},
               "match": {"path_prefix": "/api/"}}
    stack = start(stack_of, tmp_path, monthly)
    put = "/admin/plans?rule=monthly&value={}&plan=gold&requests=6&per=1h"
    assert admin(stack, "PUT", put.format("carol"), token=None)[0] == 401
    assert admin(stack, "PUT", put.format("carol"), token=ADMIN_TOKEN + "x")[0] == 401
    assert stack.redis("EXISTS", "rl:{plans}") == 0
    # Carol spends her month's 2 before her plan: an upgrade gives her the 4 more at once.
    assert admitted(stack, "carol", 3)[0] == 2
    status, body = admin(stack, "PUT", put.format("carol"))
    assert status == 200, body
    assert admin(stack, "PUT", "/admin/plans?rule=monthly&plan=gold&requests=6&per=1h")[0] == 400
    wait_for_plan(stack, probes(stack, 60, "gold", 6, rule="monthly"), 6, uses=1)
    # On a calendar quota the plan's requests are the period's quota; what was spent in
    # the period stays spent. (Through gateway 1 first: gateway 0 may hold carol's
    # refusal in its deny cache for a second.)
    time.sleep(1)
    assert admitted(stack, "carol", 6)[0] == 4
    assert admitted(stack, "dave", 3)[0] == 2
    listed = {p["key"]: p["plan"] for p in json.loads(admin(stack, "GET", "/admin/plans")[1])}
    assert (len(listed), listed["rl:monthly:carol"]) == (61, "gold")
    cleared = admin(stack, "DELETE", "/admin/plans?rule=monthly&value=carol")
    assert json.loads(cleared[1])["cleared"] is True
