"""Shadow mode end to end, two gateways: a rule (or the whole plugin) in shadow mode
checks and takes tokens as configured but never denies; `shadow_denied` counts exactly
the requests enforcing would have refused."""

from testbed.plugins import plugin, rule


def test_a_shadow_rule_never_denies_and_counts_exactly_the_would_be_denials(stack_of):
    # Shadow: 3 an hour per user. Enforced: 6 an hour per user, which still denies.
    config = plugin(rule("new-limit", ["user"], 3, mode="shadow"),
                    rule("old-limit", ["user"], 6))
    stack = stack_of(config, gateways=2)
    alice = {"x-user-id": "alice"}
    got = [stack.get(g, "/api/x", alice)[0] for g in (0, 1) * 4]
    assert got == [200] * 6 + [429] * 2, got
    stats = [stack.stats(g) for g in (0, 1)]
    # Requests 4, 5 and 6 passed the shadow rule's empty bucket: 3 would-be denials.
    assert sum(s["shadow_denied"] for s in stats) == 3
    assert sum(s["allowed"] for s in stats) == 3
    assert sum(s["denied"] + s["denied_cached"] for s in stats) == 2
    assert "shadow: rule new-limit would have denied rl:new-limit:alice" in stack.logs("envoy-0")


def test_the_whole_plugin_in_shadow_mode_denies_nothing_even_without_a_backend(stack_of):
    config = plugin(rule("per-user", ["user"], 2), mode="shadow", timeout_ms=300)
    stack = stack_of(config, gateways=2)
    bob = {"x-user-id": "bob"}
    assert [stack.get(g, "/api/x", bob)[0] for g in (0, 1) * 3] == [200] * 6
    assert sum(stack.stats(g)["shadow_denied"] for g in (0, 1)) == 4
    stack.bridge.kill()
    assert [stack.get(g, "/api/x", bob)[0] for g in (0, 1)] == [200, 200]
