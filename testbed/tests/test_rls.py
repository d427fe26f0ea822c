"""Envoy's own `ratelimit` filter with the bridge as its Rate Limit Service (`--rls-config`),
no wasm: two real Envoys, descriptors made by Envoy's actions (a header, the path, the
client's address, a generic key), envoyproxy/ratelimit's YAML, exact limits across both
gateways, costs reported at stream end (`apply_on_stream_done`), shadow mode, the failure
modes, the gateways' token, and a bridge restarted with nothing lost."""

import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from testbed.in_flight import judge
from testbed.llm_upstream import LlmUpstream
from testbed.native_ratelimit import RlsStack
from testbed.stack import BRIDGE, free_port, request, wait_for

LIMITS = """
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: plan
    value: free
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: path
    value: "/shadow/*"
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: llm_user
    rate_limit: {unit: hour, requests_per_unit: 100}
"""

USER = {"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}
PATH = {"actions": [{"request_headers": {"header_name": ":path", "descriptor_key": "path"}}]}
PLAN = {"actions": [{"generic_key": {"descriptor_key": "plan", "descriptor_value": "free"}},
                    {"remote_address": {}}]}
# Token usage as AI gateways meter it: at the request, a check of 0 hits (is anything left?);
# at the stream's end, the usage the upstream reported, taken in full.
LLM = {"actions": [{"request_headers": {"header_name": "x-llm-user", "descriptor_key": "llm_user"}}]}
LLM_ASK = {**LLM, "hits_addend": {"number": 0}}
LLM_USAGE = {**LLM, "hits_addend": {"format": "%RESP(x-tokens)%"}, "apply_on_stream_done": True}


def bridge_series(stack, name, **labels):
    """A series of the bridge's /metrics, 0 if absent."""
    _, _, body = request(stack.bridge_port, "/metrics")
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in body.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.fixture
def rls_stack():
    started = []

    def make(rate_limits, limits=LIMITS, **options):
        stack = RlsStack(limits, rate_limits, **options)
        started.append(stack)
        return stack.start()

    yield make
    for stack in started:
        stack.close()


def test_exact_limits_across_two_gateways_from_headers_paths_and_addresses(rls_stack):
    stack = rls_stack([USER, PATH, PLAN])
    alice = {"x-user": "alice"}
    answers = [stack.get(g, "/api", alice) for g in (0, 1) * 4]
    assert [a[0] for a in answers] == [200] * 5 + [429] * 3, [a[0] for a in answers]
    ok, over = answers[0][1], answers[5][1]
    assert ok["x-ratelimit-limit"] == "5, 5;w=60" and ok["x-ratelimit-remaining"] == "4", ok
    assert over["x-ratelimit-remaining"] == "0" and 11 <= int(over["retry-after"]) <= 12, over
    # Another user has a bucket of its own.
    assert stack.get(1, "/api", {"x-user": "bob"})[0] == 200
    # The path in shadow mode: never refused, counted.
    assert [stack.get(g, "/shadow/x")[0] for g in (0, 1, 0)] == [200] * 3
    assert bridge_series(stack, "ratelimit_bridge_rls_shadow_mode_total",
                         domain="api", key="path_/shadow/*") == 2
    # Every request carried the plan's descriptor with the client's address.
    assert bridge_series(stack, "ratelimit_bridge_rls_total_hits_total",
                         domain="api", key="plan_free.remote_address") == 12
    assert bridge_series(stack, "ratelimit_bridge_rls_over_limit_total",
                         domain="api", key="user") == 3
    assert sum(stack.counter(g, "cluster.origin.ratelimit.over_limit") for g in (0, 1)) == 3


def test_each_client_address_has_its_own_bucket(rls_stack):
    stack = rls_stack([{"actions": [{"remote_address": {}}]}], gateways=1)
    one = [stack.get(0, "/", source="127.0.0.2")[0] for _ in range(4)]
    two = [stack.get(0, "/", source="127.0.0.3")[0] for _ in range(4)]
    assert one == two == [200] * 3 + [429], (one, two)


def test_token_usage_reported_at_stream_end_is_charged_in_full(rls_stack):
    # Envoy honours `hits_addend` and `apply_on_stream_done` in the filter's own
    # `rate_limits` (where Envoy Gateway puts them), not in a route's.
    stack = rls_stack([], gateways=2, origin_headers={"x-tokens": "30"},
                      ratelimit_options={"rate_limits": [LLM_ASK, LLM_USAGE]})
    carol = {"x-llm-user": "carol"}
    got = []
    for g in (0, 1) * 3:
        got.append(stack.get(g, "/v1/chat/completions", carol)[0])
        # The usage goes out when the stream ends, after the client has its answer.
        charged = 30 * got.count(200)
        wait_for("the usage", lambda: bridge_series(
            stack, "ratelimit_bridge_rls_total_hits_total", domain="api",
            key="llm_user") == charged, timeout=10)
    # 100 an hour, 30 a response: four responses (120, into debt), then refused.
    assert got == [200] * 4 + [429] * 2, got
    assert bridge_series(stack, "ratelimit_bridge_rls_total_hits_total",
                         domain="api", key="llm_user") == 4 * 30
    assert bridge_series(stack, "ratelimit_bridge_rls_over_limit_total",
                         domain="api", key="llm_user") == 30 + 2 * 0


def test_a_reservation_at_the_request_settles_on_the_usage_at_stream_end(rls_stack):
    # An AI gateway's pattern: reserve the request's max_tokens, then settle on the usage.
    reserve = {"actions": [*LLM["actions"], {"generic_key": {
        "descriptor_key": "ratelimit.reserve", "descriptor_value": "1"}}],
        "hits_addend": {"format": "%REQ(x-max-tokens)%"}}
    commit = {"actions": [*LLM["actions"], {"request_headers": {
        "header_name": "x-max-tokens", "descriptor_key": "ratelimit.reserved"}}],
        "hits_addend": {"format": "%RESP(x-tokens)%"}, "apply_on_stream_done": True}
    stack = rls_stack([], gateways=2, origin_headers={"x-tokens": "30"},
                      ratelimit_options={"rate_limits": [reserve, commit]})
    got, hits = [], 0
    # 100 an hour, 30 used a response: reserving 50 leaves 70, 40, then 40 < 50 is refused;
    # reserving 10 leaves 30 then 10 (20 more taken each time), then 10 into debt.
    for g, most in zip((0, 1) * 3, (50, 50, 50, 10, 10, 10)):
        status = stack.get(g, "/v1/chat/completions",
                           {"x-llm-user": "ivy", "x-max-tokens": str(most)})[0]
        got.append(status)
        hits += most + (30 if status == 200 else 0)
        wait_for("the commit", lambda h=hits: bridge_series(
            stack, "ratelimit_bridge_rls_total_hits_total", domain="api",
            key="llm_user") == h, timeout=10)
    assert got == [200, 200, 429, 200, 200, 429], got


# docs/rate-limit-service.md's reservation: anything left (a descriptor every request
# sends, whatever its headers), the reservation of what the request asks, and the commit
# naming what the bridge said the reservation took, from the dynamic metadata (nothing
# there, "0": nothing was reserved).
RESERVE = {"actions": [*LLM["actions"], {"generic_key": {
    "descriptor_key": "ratelimit.reserve", "descriptor_value": "1"}}],
    "hits_addend": {"format": "%REQ(x-max-tokens)%"}}
COMMIT = {"actions": [*LLM["actions"], {"metadata": {
    "descriptor_key": "ratelimit.reserved", "default_value": "0",
    "metadata_key": {"key": "envoy.filters.http.ratelimit",
                     "path": [{"key": "ratelimit.reserved"}]}}}],
    "hits_addend": {"format": "%RESP(x-tokens)%"}, "apply_on_stream_done": True}
# The commit as the docs wrote it before: the client's header named twice.
COMMIT_FROM_HEADER = {**COMMIT, "actions": [*LLM["actions"], {"request_headers": {
    "header_name": "x-max-tokens", "descriptor_key": "ratelimit.reserved"}}]}


def envoy_hits(text):
    """What Envoy sends for a hits_addend format's text: it drops the descriptor (here 0)
    above 1e9, below 0 or unparsable, and truncates the rest."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return 0
    return int(value) if 0 <= value <= 1e9 else 0


@pytest.mark.parametrize("commit", [COMMIT, COMMIT_FROM_HEADER], ids=["metadata", "header"])
def test_a_client_s_own_max_tokens_never_lowers_its_bill(rls_stack, commit):
    """100 tokens an hour, 30 used a response, 8 requests a client: reserving 30 honestly
    gets 3 through. A header Envoy reads otherwise than a plain integer (dropped above 1e9,
    truncated to 0 below 1, or absent) reserves nothing, and must not be given back at the
    commit: the client is charged its usage in full, and the anything-left check refuses it
    once in debt (4 through). Before the fix every one of these got 8 of 8 through (the
    commit refunded the bucket to full, or was refused and charged nothing). With the
    commit naming the header, the bill is still never lowered (its bucket ends in debt),
    but without the anything-left check nothing stops the requests themselves."""
    rate_limits = [LLM_ASK, RESERVE, commit]
    stack = rls_stack([], gateways=1, origin_headers={"x-tokens": "30"},
                      ratelimit_options={"rate_limits": rate_limits})
    hits = lambda: bridge_series(stack, "ratelimit_bridge_rls_total_hits_total",
                                 domain="api", key="llm_user")
    # Without the header, a commit naming it is never sent (Envoy skips a descriptor whose
    # header is absent): that pattern cannot charge such a request at all.
    for named in ["30", "2000000000", "0.5", "1e-3", *([None] if commit is COMMIT else [])]:
        user = f"u-{named}"
        headers = {"x-llm-user": user, **({"x-max-tokens": named} if named else {})}
        got = []
        for _ in range(8):
            before = hits()
            status = stack.get(0, "/v1/chat/completions", headers)[0]
            got.append(status)
            if status == 200:
                wait_for("the commit", lambda: hits() == before + envoy_hits(named) + 30,
                         timeout=10)
        through = got.count(200)
        if named == "30":
            assert through == 3, got
            continue
        if commit is COMMIT:
            assert through == 4, (named, got)
        # Whatever got through, its usage was charged: the bucket is in debt, and an
        # honest request that reserves 1 is refused.
        probe = stack.get(0, "/v1/chat/completions", {"x-llm-user": user, "x-max-tokens": "1"})
        assert probe[0] == 429, (named, got)


def test_failure_modes_and_the_gateways_token(rls_stack, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    # Gateway 0 presents the token and fails open; gateway 1 has none and fails closed.
    stack = rls_stack([USER], bridge_args=["--token-file", str(token)],
                      per_gateway=[{"token": "s3cret"}, {"failure_mode_deny": True}])
    dave = {"x-user": "dave"}
    assert [stack.get(0, "/", dave)[0] for _ in range(6)] == [200] * 5 + [429]
    assert stack.get(1, "/", {"x-user": "erin"})[0] == 500
    stack.bridge.kill()
    assert stack.get(0, "/", dave)[0] == 200


def test_a_bridge_restarted_under_load_loses_nothing(rls_stack):
    stack = rls_stack([USER], gateways=2)
    frank = {"x-user": "frank"}
    assert [stack.get(g, "/", frank)[0] for g in (0, 1, 0)] == [200] * 3
    stop = threading.Event()
    answered = []  # (when, status) of each load request

    def load():
        n = 0
        while not stop.is_set():
            status = stack.get(n % 2, "/", {"x-user": f"load-{n % 50}"}, timeout=5)[0]
            answered.append((time.monotonic(), status))
            n += 1

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        stack.bridge.stop()
        stack.start_bridge()
        restarted = time.monotonic()
        # The load goes on until the restarted bridge has decided some of it.
        wait_for("load decided by the restarted bridge", lambda: sum(
            1 for t, status in answered if t > restarted and status in (200, 429)) >= 20,
            timeout=30)
    finally:
        stop.set()
        loader.join(timeout=10)
    # Frank had 2 left before the restart, and has 2 after it.
    assert [stack.get(g, "/", frank)[0] for g in (1, 0, 1)] == [200, 200, 429]
    log = stack.logs("bridge")
    assert re.search(r"rate limit service: 1 domain\(s\)", log), log


def raw_headers(port, headers):
    """A GET through a gateway: its status and every response header, repeats kept."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, [(k.lower(), v) for k, v in resp.getheaders()]
    finally:
        conn.close()


def test_a_deployment_made_for_envoyproxy_ratelimit_runs_the_bridge_unchanged():
    # Istio's sample: the YAML under $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config (a
    # ConfigMap's mount, hidden entries and all), Redis as REDIS_URL, gRPC on GRPC_PORT.
    # Envoy makes its own x-ratelimit-* headers, as many such gateways do.
    stack = RlsStack(LIMITS, [USER], gateways=1,
                     ratelimit_options={"enable_x_ratelimit_headers": "DRAFT_VERSION_03"})
    try:
        data = Path(stack.workdir) / "data"
        (data / "ratelimit" / "config").mkdir(parents=True)
        (data / "ratelimit" / "config" / "api.yaml").write_text(LIMITS)
        (data / "ratelimit" / "config" / ".hidden.yaml").write_text("not: [yaml")
        stack.bridge.argv = [BRIDGE, "--threads", "1"]
        http_port = free_port()
        stack.bridge.env = {"RUNTIME_ROOT": str(data), "RUNTIME_SUBDIRECTORY": "ratelimit",
                            "RUNTIME_WATCH_ROOT": "false", "REDIS_SOCKET_TYPE": "tcp",
                            "REDIS_URL": f"127.0.0.1:{stack.redis_port}",
                            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(stack.bridge_port),
                            "HOST": "127.0.0.1", "PORT": str(http_port),
                            "USE_STATSD": "false"}
        stack.start()
        assert request(stack.bridge_port, "/healthcheck")[0] == 200
        # Its HTTP port, which such deployments probe, answers too.
        assert request(http_port, "/healthcheck")[0] == 200
        got = [stack.get(0, "/", {"x-user": "gina"})[0] for _ in range(6)]
        assert got == [200] * 5 + [429], got
        log = stack.logs("bridge")
        assert "envoyproxy/ratelimit's environment read as RATELIMIT_BRIDGE_RLS_CONFIG" in log, log
        # Started its way, the bridge adds no header unless LIMIT_RESPONSE_HEADERS_ENABLED:
        # each of Envoy's is there once (the bridge's draft03 default sent each twice).
        status, headers = raw_headers(stack.ports[0], {"x-user": "hana"})
        names = [k for k, _ in headers if "ratelimit" in k or k == "retry-after"]
        assert status == 200 and sorted(names) == [
            "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"], headers
        # Its headers, renamed as asked, and SHADOW_MODE: gina, over her limit, passes.
        stack.bridge.stop()
        stack.bridge.env.update({"LIMIT_RESPONSE_HEADERS_ENABLED": "true",
                                 "LIMIT_REMAINING_HEADER": "X-Left", "SHADOW_MODE": "true"})
        stack.start_bridge()
        status, headers = raw_headers(stack.ports[0], {"x-user": "ivy"})
        got = dict(headers)
        assert status == 200 and got["ratelimit-limit"] == "5" and got["x-left"] == "4", headers
        assert 1 <= int(got["ratelimit-reset"]) <= 60, headers
        assert [k for k, _ in headers].count("x-ratelimit-limit") == 1, headers
        assert stack.get(0, "/", {"x-user": "gina"})[0] == 200
        assert bridge_series(stack, "ratelimit_bridge_rls_shadow_mode_total",
                             domain="api", key="user") >= 1
    finally:
        stack.close()


def tls_answer(port, context):
    """What the bridge's port says to an HTTP/2 preface over TLS made with `context`; None
    when the handshake or the read fails."""
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                return tls.recv(64)
    except (ssl.SSLError, OSError):
        return None


def test_envoy_reaches_the_bridge_over_mutual_tls():
    # A bridge reached across a network it does not trust (and Envoy Gateway's rate limit
    # service, which serves TLS): TLS on its port, a client certificate required, health on
    # a plaintext probe port. Both gateways fail open, so a broken TLS path would let
    # every request through rather than refuse the sixth.
    stack = RlsStack(LIMITS, [USER], gateways=2, tls=True).start()
    try:
        got = [stack.get(i % 2, "/", {"x-user": "tess"})[0] for i in range(6)]
        assert got == [200] * 5 + [429], got
        for gateway in (0, 1):
            assert stack.counter(gateway, "cluster.ratelimit_bridge.ssl.handshake") >= 1
            assert stack.counter(gateway, "cluster.origin.ratelimit.over_limit") \
                == (1 if gateway == 1 else 0)
        trusted = ssl.create_default_context(cafile=stack.pki["ca"])
        assert tls_answer(stack.bridge_port, trusted) in (None, b""), \
            "served a client without a certificate"
        trusted = ssl.create_default_context(cafile=stack.pki["ca"])
        trusted.load_cert_chain(stack.pki["client_cert"], stack.pki["client_key"])
        settings = tls_answer(stack.bridge_port, trusted)
        assert settings and settings[3] == 4, settings  # an HTTP/2 SETTINGS frame
        assert request(stack.health_port, "/healthz")[0] == 200
    finally:
        stack.close()


def test_operators_overrides_and_usage_reach_the_services_buckets(rls_stack, tmp_path):
    """`override set --domain --entry` (a descriptor, or a whole domain) and `usage` on the
    rate limit service's buckets, through real Envoys: the same commands, records and cache
    as a plugin rule's, scoped by domain."""
    from testbed.tests.test_overrides import ADMIN_TOKEN, WITHIN, admin, bridge, until
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
    stack = rls_stack([USER], bridge_args=["--admin-token-file", str(tmp_path / "admin-token")])
    users = iter(range(1000))

    def admitted(user, n):
        return sum(stack.get(i % 2, "/api", {"x-user": user})[0] == 200 for i in range(n))

    # alice's own descriptor: 2 an hour; every user's (the key alone): 3 an hour; instead
    # of the configured 5 a minute. Written in that order: once the second is seen, so is
    # the first (the bridges read every override at once).
    bridge(stack, "override", "set", "--domain", "api", "--entry", "user=alice",
           "--requests", "2", "--per", "1h", "--ttl", "1m")
    bridge(stack, "override", "set", "--domain", "api", "--entry", "user",
           "--requests", "3", "--per", "1h", "--ttl", "1m")
    written = time.monotonic()
    until("the overrides", lambda: admitted(f"probe-{next(users)}", 6) == 3, written + WITHIN)
    assert admitted("alice", 4) == 2, "alice's own override wins"
    assert admitted("bob", 6) == 3
    listed = {o["key"]: o["scope"] for o in bridge(stack, "override", "list")}
    assert listed == {"rl:rls:api:user:alice": "descriptor", "rl:rls:api:user": "descriptor"}
    usage = bridge(stack, "usage", "--rls-config", str(stack.rls_file), "--domain", "api",
                   "--entry", "user=alice")
    assert (usage["key"], usage["limit"], usage["remaining"], usage["rule"]) == \
        ("rl:rls:api:user:alice", 2, 0, "user"), usage
    # The whole domain: 1 an hour for every descriptor without an override of its own.
    status, body = admin(stack, "PUT", "/admin/overrides?domain=api&requests=1&per=1h&ttl=1m")
    assert status == 200 and json.loads(body)["scope"] == "domain", body
    bridge(stack, "override", "clear", "--domain", "api", "--entry", "user")
    written = time.monotonic()
    until("the domain's override", lambda: admitted(f"probe-{next(users)}", 2) == 1,
          written + WITHIN)
    status, body = admin(stack, "GET", "/admin/usage?domain=api&entry=user%3Dcarol")
    assert status == 200, body
    assert (json.loads(body)["limit"], json.loads(body)["override"]["key"]) == (1, "rl:rls:api")
    # Cleared, the configured limit is back.
    assert bridge(stack, "override", "clear", "--domain", "api") == \
        {"key": "rl:rls:api", "cleared": True}
    gone = time.monotonic()
    until("the domain's limit back", lambda: admitted(f"probe-{next(users)}", 6) == 5,
          gone + WITHIN)
    # A plugin rule cannot name the service's buckets, nor unblock them.
    refused = subprocess.run([BRIDGE, "override", "set", "--rule", "rls", "--requests", "1",
                              "--per", "1h", "--ttl", "1m", *stack.redis_args],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "--domain" in refused.stderr, refused.stderr
    unblock = subprocess.run([BRIDGE, "unblock", "--domain", "api", "--entry", "user=alice",
                              *stack.redis_args], capture_output=True, text=True, timeout=30)
    assert unblock.returncode == 1 and "no block" in unblock.stderr, unblock.stderr


IN_FLIGHT = """
domain: api
descriptors:
  - key: user
    rate_limit: {in_flight: {max: 2, ttl: 1m}}
"""
LLM_USER = {"request_headers": {"header_name": "x-user-id", "descriptor_key": "user"}}
# docs/rate-limit-service.md: the request's slot taken at its start, given back at its end.
TAKE_SLOT = {"actions": [LLM_USER, {"request_headers": {
    "header_name": "x-request-id", "descriptor_key": "ratelimit.slot"}}]}
GIVE_SLOT_BACK = {"actions": [LLM_USER, {"request_headers": {
    "header_name": "x-request-id", "descriptor_key": "ratelimit.release"}}],
    "apply_on_stream_done": True}
STREAM = {"model": "m", "messages": [], "stream": True}


def test_in_flight_limits_through_envoy_s_own_filter_across_two_gateways(rls_stack):
    with LlmUpstream() as upstream:
        stack = rls_stack([], limits=IN_FLIGHT, gateways=2, upstream=upstream.port,
                          ratelimit_options={"rate_limits": [TAKE_SLOT, GIVE_SLOT_BACK]})

        def hold(gateway, name, **headers):
            thread = threading.Thread(target=stack.stream, args=(gateway,), kwargs={
                "body": STREAM, "headers": {"x-user-id": "ana", "x-test-hold": name,
                                            **headers}}, daemon=True)
            thread.start()
            return thread

        def holding(name, count):
            wait_for(f"{count} held", lambda: upstream.holding(name) == count, timeout=10)

        def short(gateway, **headers):
            return stack.stream(gateway, body=STREAM, headers={
                "x-user-id": "ana", "x-test-chunks": "1", **headers}).status

        held = [hold(0, "two"), hold(1, "two")]
        holding("two", 2)
        assert short(0) == 429 and short(1) == 429, "both slots held, one per gateway"
        upstream.release("two", 2)
        for thread in held:
            thread.join(10)
        # The stream-done calls gave both back: the slots live a minute, so a leak would
        # refuse these for that long.
        wait_for("a slot back", lambda: short(0) == 200, timeout=5)
        assert short(1) == 200
        # A client reusing a live request's x-request-id (Envoy keeps a client's own id
        # unless told otherwise) is refused, though a slot is free.
        mine = {"x-request-id": "3f2b1c9e-reused"}
        held = hold(0, "one", **mine)
        holding("one", 1)
        assert short(1, **mine) == 429
        assert short(1) == 200, "the other slot is free"
        upstream.release("one")
        held.join(10)
    verdict = judge([(s.at, s.ended) for s in upstream.served], 2)
    assert verdict.violations == [], verdict
