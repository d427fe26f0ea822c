"""Higress's matchRules as the plugin receives them (`_rules_`), end to end in real Envoy:
a request's host or route picks an entry's rules instead of the top-level ones. The route
is envoy.yaml's, named `upstream` (Envoy's `route_name` property)."""

from testbed.plugins import plugin, rule


def limits_seen(stack, host, n):
    """Statuses of `n` requests for one client on `host`, and the limit the last one showed."""
    got = [stack.get(0, "/api/x", {"x-user-id": "alice", "host": host}) for _ in range(n)]
    return [status for status, _, _ in got], got[-1][1].get("x-ratelimit-limit")


def test_the_first_matching_entry_limits_a_request_by_its_host_or_its_route(stack_of):
    config = plugin(rule("everywhere", ["user"], 5), _rules_=[
        {"_match_domain_": ["*.example.com"], "rules": [rule("tenants", ["user"], 2)]},
        {"_match_route_": ["upstream"], "rules": [rule("routed", ["user"], 3)]},
    ])
    stack = stack_of(config)
    assert limits_seen(stack, "a.example.com:8080", 3) == ([200, 200, 429], "2")
    # Another host of the same domain shares the entry's bucket for alice.
    assert limits_seen(stack, "B.Example.com", 1) == ([429], "2")
    assert limits_seen(stack, "shop.test", 4) == ([200, 200, 200, 429], "3")
    assert stack.stats(0)["allowed_rule=everywhere"] == 0


def test_a_request_no_entry_matches_gets_the_top_level_rules(stack_of):
    config = plugin(rule("everywhere", ["user"], 2), _rules_=[
        {"_match_route_": ["checkout"], "rules": [rule("checkout", ["user"], 1)]},
        {"_match_domain_": ["admin.*"], "rules": [rule("admin", ["user"], 1)]},
    ])
    stack = stack_of(config)
    assert limits_seen(stack, "shop.test", 3) == ([200, 200, 429], "2")
    assert limits_seen(stack, "admin.shop.test", 2) == ([200, 429], "1")
