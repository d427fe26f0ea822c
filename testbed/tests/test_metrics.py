"""Per-rule counters as Prometheus scrapes them, end to end: Envoy's `stats_tags` (in
envoy.yaml) turns `wasmcustom.ratelimit.<counter>_rule=<rule>` into the family
`ratelimit_<counter>_rule` with a `rule` label at /stats/prometheus. Each kind of outcome is
driven through its own rule and counted exactly."""

from prometheus_client.parser import text_string_to_metric_families

from testbed.plugins import plugin, rule
from testbed.stack import request, wait_for

PER_RULE = ["allowed", "denied", "denied_cached", "blocked", "allowed_leased", "shadow_denied"]


def scrape(admin_port):
    """{(family, rule): value} for the per-rule families, read by Prometheus' own parser, as
    they are now (the filter hands its counts to Envoy on its tick: `counted` waits)."""
    status, _, body = request(admin_port, "/stats/prometheus")
    assert status == 200
    return {(family.name, sample.labels["rule"]): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if family.name.startswith("ratelimit_") and "rule" in sample.labels}


def test_every_per_rule_counter_reaches_prometheus_with_its_rule_label(stack_of):
    def on(path, r):
        return r | {"match": {"path_prefix": path}}
    hot = on("/hot", rule("hot", [], 1000, lease={"tokens": 10}))
    config = plugin(
        on("/api", rule("per-user", ["user"], 2)),
        on("/login", rule("login.v1", ["user"], 1,
                          block={"after": 1, "within": "1m", "for": "1m", "status": 403})),
        hot,
        on("/shadow", rule("trial", ["user"], 1, mode="shadow")),
    )
    stack = stack_of(config)
    got = [stack.get(0, "/api/x", {"x-user-id": "alice"})[0] for _ in range(4)]
    assert got == [200, 200, 429, 429]
    got = [stack.get(0, "/login", {"x-user-id": "bob"})[0] for _ in range(3)]
    assert got == [200, 403, 403]
    assert [stack.get(0, "/hot")[0] for _ in range(6)] == [200] * 6
    assert [stack.get(0, "/shadow", {"x-user-id": "carol"})[0] for _ in range(3)] == [200] * 3

    # One worker: the second /hot request asks for a lease, the next four use it.
    expected = {
        ("ratelimit_allowed_rule", "per-user"): 2,
        ("ratelimit_denied_rule", "per-user"): 1,
        ("ratelimit_denied_cached_rule", "per-user"): 1,
        ("ratelimit_allowed_rule", "login.v1"): 1,
        ("ratelimit_blocked_rule", "login.v1"): 2,
        ("ratelimit_allowed_rule", "hot"): 2,
        ("ratelimit_allowed_leased_rule", "hot"): 4,
        ("ratelimit_allowed_rule", "trial"): 1,
        ("ratelimit_shadow_denied_rule", "trial"): 2,
    }

    def counted():
        metrics = scrape(stack.admin_ports[0])
        for name in ["per-user", "login.v1", "hot", "trial"]:
            for counter in PER_RULE:
                assert (f"ratelimit_{counter}_rule", name) in metrics, (counter, name)
        value = {k: v for k, v in metrics.items() if v}
        assert value == expected, value
        return True
    # Until the filter's tick has handed every count to Envoy (the last try's mismatch is
    # in the failure); a count past the expected one never matches.
    wait_for("the per-rule counters", counted, timeout=20)
    # The global counters keep their own, unlabelled families.
    assert stack.stats(0)["allowed"] == 2 + 1 + 2 + 1
