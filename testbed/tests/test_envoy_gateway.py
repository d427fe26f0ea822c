"""Envoy Gateway's global rate limiting with the bridge in envoyproxy/ratelimit's place, as
its users get it: the bridge started from the environment of Envoy Gateway's rate limit
Deployment (no arguments), configured over xDS (state of the world, mutual TLS) with the
`RateLimitConfig`s Envoy Gateway generates, and real Envoys carrying the filters and
per-route `rate_limits` its translator generates for `BackendTrafficPolicy` rules
(`testbed/envoy_gateway.py`; the shapes read from envoyproxy/gateway's
`internal/xds/translator/ratelimit.go` and its testdata).

Each test names the `BackendTrafficPolicy` rule it stands for. Envoy Gateway's defaults are
a 20 ms timeout and failing open; these gateways wait 2 s and fail closed (`rateLimit:
{timeout: 2s, failClosed: true}` in the EnvoyGateway configuration), so that a slow
machine never lets a request through that the limit should refuse, and a broken path shows
as a 500 rather than as a pass."""

import http.client

import pytest

from testbed.envoy_gateway import LISTENER, EnvoyGatewayStack, response_metadata, route
from testbed.stack import request, wait_for

# Envoy Gateway names an HTTPRoute's route in xDS `httproute/<namespace>/<name>/rule/<i>/
# match/<j>/<hostname>`; a rule that is not shared is keyed by it.
ROUTE_A = "httproute/default/a/rule/0/match/0/*"
ROUTE_B = "httproute/default/b/rule/0/match/0/*"


def generic(key):
    """The generic key every rule's actions start with (the route, or the shared rule)."""
    return {"generic_key": {"descriptor_key": key, "descriptor_value": key}}


def header_exact(rule, match, header, value):
    """`clientSelectors.headers: [{name, value}]` (type Exact)."""
    key = f"rule-{rule}-match-{match}"
    return {"header_value_match": {"descriptor_key": key, "descriptor_value": key,
                                   "expect_match": True,
                                   "headers": [{"name": header,
                                                "string_match": {"exact": value}}]}}


def header_distinct(rule, match, header):
    """`clientSelectors.headers: [{name, type: Distinct}]`: one bucket per value."""
    return {"request_headers": {"header_name": header,
                                "descriptor_key": f"rule-{rule}-match-{match}"}}


def cidr_ranges(cidr):
    prefix, length = cidr.split("/")
    return {"ranges": [{"address_prefix": prefix, "prefix_len": int(length)}]}


def cidr_exact(cidr):
    """`clientSelectors.sourceCIDR: {type: Exact, value}`: one bucket for the range."""
    return {"remote_address_match": {"descriptor_key": "masked_remote_address",
                                     "descriptor_value": cidr,
                                     "address_matcher": cidr_ranges(cidr)}}


def cidr_distinct(cidr):
    """The action `sourceCIDR: {type: Distinct}` adds after `cidr_exact`: one bucket per
    address in the range."""
    return {"remote_address_match": {"descriptor_key": "remote_address",
                                     "descriptor_value": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
                                     "address_matcher": cidr_ranges(cidr)}}


def limit(per_unit, unit):
    return {"rate_limit": {"unit": unit, "requests_per_unit": per_unit}}


def under(key, *descriptors, value=None):
    """A configured descriptor `key` (valued `value`, or its own key as Envoy Gateway's
    generic keys are) holding `descriptors`."""
    return {"key": key, "value": key if value is None else value,
            "descriptors": list(descriptors)}


def series(stack, name, domain):
    """The sum of a bridge series over the configured descriptors of `domain`, read on its
    Prometheus port (PROMETHEUS_ADDR)."""
    _, _, body = request(stack.prometheus_port, "/metrics")
    wanted = f'{name}{{domain="{domain}",'
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in body.splitlines()
               if line.startswith(wanted))


@pytest.fixture
def gateway():
    started = []

    def make(routes, domains=(LISTENER,), **options):
        stack = EnvoyGatewayStack(routes, domains, **options)
        started.append(stack)
        return stack.start()

    yield make
    for stack in started:
        stack.close()


def statuses(stack, path, headers=None, gateways=(0,), n=1, source=None):
    return [stack.get(gateways[i % len(gateways)], path, headers, source=source)[0]
            for i in range(n)]


def raw_headers(port, path, headers):
    """A GET's status and every response header, repeats kept."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, [(k.lower(), v) for k, v in resp.getheaders()]
    finally:
        conn.close()


def test_the_deployment_s_environment_and_its_xds_configuration(gateway):
    """rules: [{clientSelectors: [{headers: [{name: x-user-id, value: one}]}],
    limit: {requests: 3, unit: Minute}}] on HTTPRoute `a`."""
    stack = gateway([route(ROUTE_A, "/a", {LISTENER: [
        {"actions": [generic(ROUTE_A), header_exact(0, 0, "x-user-id", "one")]}]})])
    # The bridge subscribed as the Deployment's node, for RateLimitConfigs, over mutual TLS.
    wait_for("the subscription", lambda: stack.xds.requests, timeout=10)
    first = stack.xds.requests[0]
    assert first["node"] == "envoy-ratelimit", first
    assert first["type_url"].endswith("ratelimit.config.ratelimit.v3.RateLimitConfig"), first
    # FORCE_START_WITHOUT_INITIAL_CONFIG: before Envoy Gateway's first answer, nothing is
    # limited (and nothing fails: these gateways fail closed).
    assert statuses(stack, "/a", {"x-user-id": "one"}, n=5) == [200] * 5
    stack.serve([{"domain": LISTENER, "descriptors": [under(ROUTE_A, {
        "key": "rule-0-match-0", "value": "rule-0-match-0", **limit(3, "MINUTE")})]}])
    got = statuses(stack, "/a", {"x-user-id": "one"}, n=4)
    assert got == [200] * 3 + [429], got
    # Another value matches no selector: no descriptor, no limit.
    assert statuses(stack, "/a", {"x-user-id": "two"}, n=4) == [200] * 4
    # Envoy Gateway has Envoy make the x-ratelimit-* headers (DRAFT_VERSION_03); the bridge,
    # started from an environment without LIMIT_RESPONSE_HEADERS_ENABLED, adds none, so
    # each is there once.
    status, headers = raw_headers(stack.ports[0], "/a", {"x-user-id": "one"})
    names = sorted(k for k, _ in headers if "ratelimit" in k or k == "retry-after")
    assert status == 429 and names == ["x-ratelimit-limit", "x-ratelimit-remaining",
                                       "x-ratelimit-reset"], headers
    assert dict(headers)["x-ratelimit-limit"] == "3, 3;w=60", headers
    # Its probes: /healthcheck on HOST:PORT, /metrics on PROMETHEUS_ADDR; Envoy reached the
    # gRPC port over TLS.
    assert request(stack.http_port, "/healthcheck")[0] == 200
    assert series(stack, "ratelimit_bridge_rls_over_limit_total", LISTENER) == 2
    assert stack.counter(0, "cluster.ratelimit_cluster.ssl.handshake") >= 1
    assert "envoyproxy/ratelimit's environment read as" in stack.logs("bridge")


def test_each_distinct_header_value_has_its_own_bucket_on_each_route(gateway):
    """rules: [{clientSelectors: [{headers: [{name: x-user-id, type: Distinct}]}],
    limit: {requests: 3, unit: Minute}}], not shared, on HTTPRoutes `a` and `b`, through
    two Envoys of the same Gateway."""
    rule = lambda r: {"actions": [generic(r), header_distinct(0, 0, "x-user-id")]}  # noqa: E731
    stack = gateway([route(ROUTE_A, "/a", {LISTENER: [rule(ROUTE_A)]}),
                     route(ROUTE_B, "/b", {LISTENER: [rule(ROUTE_B)]})], gateways=2)
    per_user = {"key": "rule-0-match-0", **limit(3, "MINUTE")}
    stack.serve([{"domain": LISTENER, "descriptors": [under(ROUTE_A, per_user),
                                                      under(ROUTE_B, per_user)]}])
    alice = {"x-user-id": "alice"}
    # Both Envoys take from one bucket.
    assert statuses(stack, "/a", alice, gateways=(0, 1), n=5) == [200] * 3 + [429] * 2
    # Each value has its own, and each route its own.
    assert statuses(stack, "/a", {"x-user-id": "bob"}, n=4) == [200] * 3 + [429]
    assert statuses(stack, "/b", alice, gateways=(1, 0), n=4) == [200] * 3 + [429]
    # No header, no descriptor: Envoy sends nothing for the rule, and nothing limits it.
    assert statuses(stack, "/a", n=5) == [200] * 5
    assert sum(stack.counter(g, "cluster.backend.ratelimit.over_limit") for g in (0, 1)) == 4


def test_a_rule_in_shadow_mode_is_counted_and_never_refused(gateway):
    """rules: [{clientSelectors: [{headers: [{name: x-user-id, type: Distinct}]}],
    limit: {requests: 2, unit: Minute}, shadowMode: true}] on HTTPRoute `a`."""
    stack = gateway([route(ROUTE_A, "/a", {LISTENER: [
        {"actions": [generic(ROUTE_A), header_distinct(0, 0, "x-user-id")]}]})])
    stack.serve([{"domain": LISTENER, "descriptors": [under(ROUTE_A, {
        "key": "rule-0-match-0", "shadow_mode": True, **limit(2, "MINUTE")})]}])
    assert statuses(stack, "/a", {"x-user-id": "erin"}, n=5) == [200] * 5
    assert series(stack, "ratelimit_bridge_rls_shadow_mode_total", LISTENER) == 3
    assert series(stack, "ratelimit_bridge_rls_over_limit_total", LISTENER) == 0


def test_source_cidr_distinct_and_exact(gateway):
    """Route `a`: clientSelectors: [{sourceCIDR: {type: Distinct, value: 127.0.0.0/30}}],
    2 a minute per address. Route `b`: sourceCIDR {type: Exact, value: 127.0.0.0/30},
    3 a minute for the whole range."""
    cidr = "127.0.0.0/30"
    stack = gateway([
        route(ROUTE_A, "/a", {LISTENER: [
            {"actions": [generic(ROUTE_A), cidr_exact(cidr), cidr_distinct(cidr)]}]}),
        route(ROUTE_B, "/b", {LISTENER: [
            {"actions": [generic(ROUTE_B), cidr_exact(cidr)]}]})])
    masked = lambda *inner, **rate: {  # noqa: E731
        "key": "masked_remote_address", "value": cidr, "descriptors": list(inner), **rate}
    stack.serve([{"domain": LISTENER, "descriptors": [
        under(ROUTE_A, masked({"key": "remote_address", **limit(2, "MINUTE")})),
        under(ROUTE_B, masked(**limit(3, "MINUTE")))]}])
    for source in ("127.0.0.2", "127.0.0.3"):
        got = statuses(stack, "/a", n=3, source=source)
        assert got == [200, 200, 429], (source, got)
    # Outside the range, no selector matches: not limited.
    assert statuses(stack, "/a", n=4, source="127.0.0.5") == [200] * 4
    # Exact: the range shares one bucket, whichever address in it asks.
    got = [stack.get(0, "/b", source=s)[0] for s in ("127.0.0.2", "127.0.0.3") * 2]
    assert got == [200] * 3 + [429], got
    assert statuses(stack, "/b", n=2, source="127.0.0.6") == [200] * 2


def test_a_shared_rule_is_one_bucket_across_routes_and_gateways(gateway):
    """BackendTrafficPolicy default/shared-policy on HTTPRoutes `a` and `b`, attached to
    two Gateways (`eg` and `eg2`, one Envoy each): rule 0 `shared: true`, x-user-id
    Distinct, 4 a minute; rule 1, not shared, x-user-id Distinct, 3 a minute. The shared
    rule gets a filter and a domain of its own
    (`envoy.filters.http.ratelimit/default/shared-policy`), so each request makes two
    calls; the other rule is in each Gateway's listener domain."""
    shared, shared_rule = "default/shared-policy", "default/shared-policy/rule/0"
    other = "default/eg2/http"

    def routes(listener):
        def rules(r):
            return {listener: [{"actions": [generic(r), header_distinct(0, 0, "x-user-id")]}],
                    shared: [{"actions": [generic(shared_rule),
                                          header_distinct(0, 0, "x-user-id")]}]}
        return [route(ROUTE_A, "/a", rules(ROUTE_A), listener),
                route(ROUTE_B, "/b", rules(ROUTE_B), listener)]

    stack = gateway(routes(LISTENER), domains=(LISTENER, shared), gateways=2, per_gateway=[
        {}, {"listener": other, "routes": routes(other), "domains": (other, shared)}])
    per_route = {"key": "rule-0-match-0", **limit(3, "MINUTE")}
    stack.serve([
        *({"domain": d, "descriptors": [under(ROUTE_A, per_route), under(ROUTE_B, per_route)]}
          for d in (LISTENER, other)),
        {"domain": shared, "descriptors": [under(shared_rule, {
            "key": "rule-0-match-0", **limit(4, "MINUTE")})]}])
    alice = {"x-user-id": "alice"}
    got = [stack.get(g, p, alice)[0] for g, p in [(0, "/a"), (1, "/b"), (1, "/a"), (0, "/b"),
                                                  (0, "/a"), (1, "/b")]]
    # Four in all, whichever route and Gateway: the shared bucket.
    assert got == [200] * 4 + [429] * 2, got
    # On one route of one Gateway, the route's own rule refuses first (3 < 4); the same
    # route on the other Gateway has a bucket of its own there, and the shared rule's last.
    carol = {"x-user-id": "carol"}
    assert statuses(stack, "/a", carol, n=4) == [200] * 3 + [429]
    assert statuses(stack, "/a", carol, gateways=(1,), n=2) == [200, 429]
    assert series(stack, "ratelimit_bridge_rls_over_limit_total", shared) == 3
    assert series(stack, "ratelimit_bridge_rls_over_limit_total", LISTENER) == 1
    assert series(stack, "ratelimit_bridge_rls_over_limit_total", other) == 0


TOKENS = ("io.envoyproxy.gateway.ai", "llm_total_token")


def test_request_and_response_costs(gateway):
    """Route `a`: x-user-id Distinct, 100 an hour, cost: {request: {from: Number, number:
    0}, response: {from: Metadata, metadata: {namespace: io.envoyproxy.gateway.ai, key:
    llm_total_token}}}, the usage an AI gateway's filter records after the response (here
    copied from the backend's `x-tokens: 30`). Route `b`: x-user-id Distinct, 10 a minute,
    cost: {request: {from: Number, number: 3}}."""
    user_a = [generic(ROUTE_A), header_distinct(0, 0, "x-user-id")]
    stack = gateway([
        route(ROUTE_A, "/a", {LISTENER: [
            {"actions": user_a, "hits_addend": {"number": 0}},
            {"actions": user_a, "apply_on_stream_done": True,
             "hits_addend": {"format": "%DYNAMIC_METADATA({}:{})%".format(*TOKENS)}}]}),
        route(ROUTE_B, "/b", {LISTENER: [
            {"actions": [generic(ROUTE_B), header_distinct(0, 0, "x-user-id")],
             "hits_addend": {"number": 3}}]})],
        backend_headers={"x-tokens": "30"}, filters_after=[response_metadata("x-tokens", *TOKENS)])
    stack.serve([{"domain": LISTENER, "descriptors": [
        under(ROUTE_A, {"key": "rule-0-match-0", **limit(100, "HOUR")}),
        under(ROUTE_B, {"key": "rule-0-match-0", **limit(10, "MINUTE")})]}])
    hits = lambda: series(stack, "ratelimit_bridge_rls_total_hits_total", LISTENER)  # noqa: E731
    got = []
    for _ in range(6):
        got.append(stack.get(0, "/a", {"x-user-id": "dana"})[0])
        # The usage is charged when the stream ends, after the client has its answer.
        charged = 30 * got.count(200)
        wait_for("the usage", lambda: hits() == charged, timeout=10)
    # 100 an hour, 30 a response: the fourth takes it into debt, then each is refused.
    assert got == [200] * 4 + [429] * 2, got
    # A request costing 3 of 10: three pass (9), the fourth cannot pay its 3.
    assert statuses(stack, "/b", {"x-user-id": "dana"}, n=5) == [200] * 3 + [429] * 2
