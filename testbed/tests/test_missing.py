"""`"missing": "deny"` end to end, in real Envoy: a request that lacks an identity a rule
needs is refused by that rule (429, a body that names what is missing, counted), never let
through unlimited; `skip` (the default) leaves such a request to the other rules."""

import json

from testbed.plugins import IDENTITY, plugin, rule


def test_a_request_without_the_key_a_rule_needs_is_refused_not_let_through(stack_of):
    identity = {**IDENTITY, "api_key": {"header": "x-api-key", "missing": "deny"}}
    config = plugin(rule("per-key", ["api_key"], 2),
                    rule("per-user", ["user"], 100),
                    rule("per-user-trial", ["user"], 100, missing="deny", mode="shadow"),
                    identity=identity)
    stack = stack_of(config, gateways=2)
    for gateway in (0, 1):
        for headers in ({}, {"x-api-key": ""}, {"x-user-id": "alice"}):
            status, reply_headers, body = stack.get(gateway, "/api/x", headers)
            assert status == 429, (headers, status, body)
            assert "retry-after" not in reply_headers, reply_headers
            assert json.loads(body) == {
                "error": "Rate limit key missing",
                "message": "This request lacks the x-api-key header, which the rate limit "
                           "\"per-key\" needs to count it.",
            }
    # With the key, the rule counts it as usual: 2 an hour, on every gateway together. The
    # shadow rule that denies for want of a user only counts.
    key = {"x-api-key": "k1"}
    assert [stack.get(g, "/api/x", key)[0] for g in (0, 1, 0)] == [200, 200, 429]
    stats = [stack.stats(g) for g in (0, 1)]
    assert sum(s.get("missing", 0) for s in stats) == 6, stats
    assert sum(s.get("missing_rule=per-key", 0) for s in stats) == 6, stats
    assert sum(s.get("shadow_denied_rule=per-user-trial", 0) for s in stats) == 3, stats
    assert sum(s.get("allowed", 0) for s in stats) == 2, stats


def test_by_default_a_missing_identity_skips_only_the_rules_that_need_it(stack_of):
    config = plugin(rule("per-key", ["api_key"], 1), rule("per-ip", ["ip"], 3))
    stack = stack_of(config, gateways=1)
    # Without a key, per-key does not apply; per-ip still does.
    assert [stack.get(0, "/api/x")[0] for _ in range(4)] == [200, 200, 200, 429]
    assert stack.stats(0).get("missing", 0) == 0
