"""End to end, the way an attacker would try it: hostile request data against the real
ratelimit.wasm in real Envoy, the real bridge and a real Valkey."""

import os
import signal
import socket
import time

import pytest

from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule
from testbed.stack import load_error, request, wait_for

LONG_IDENTITIES = {f"h{i}": {"header": f"x-h{i}"} for i in range(4)}


def long_headers(fill):
    # 128 characters each: every value is kept verbatim, but four of them add up to a
    # key longer than the bridge accepts (512 bytes).
    return {f"x-h{i}": fill * 128 for i in range(4)}


def test_long_identity_values_are_limited_and_never_trip_the_breaker(stack_of):
    stack = stack_of(plugin(rule("four", ["h0", "h1", "h2", "h3"], 2), failure_mode="open", identity=LONG_IDENTITIES))
    statuses = [stack.get(0, "/api/x", long_headers("a"))[0] for _ in range(3)]
    assert statuses == [200, 200, 429]
    # Another client with long values has a bucket of its own.
    assert stack.get(0, "/api/x", long_headers("b"))[0] == 200
    for _ in range(6):
        stack.get(0, "/api/x", long_headers("a"))
    stats = stack.stats()
    assert stats.get("backend_failures", 0) == 0
    assert stats.get("short_circuits", 0) == 0
    # Every key the script wrote is within the bridge's bound.
    keys = stack.redis("KEYS", "rl:*")
    assert keys and all(k.startswith("rl:four:") and len(k) <= 512 for k in keys)


def test_a_client_over_the_key_bound_does_not_open_the_breaker_for_others(stack_of):
    stack = stack_of(plugin(rule("four", ["h0", "h1", "h2", "h3"], 1000), failure_mode="closed", identity=LONG_IDENTITIES))
    for i in range(8):
        stack.get(0, "/api/x", long_headers(chr(ord("c") + i)))
    normal = {f"x-h{i}": "alice" for i in range(4)}
    assert stack.get(0, "/api/x", normal)[0] == 200
    assert stack.stats().get("backend_failures", 0) == 0


def test_xff_trusted_hops_count_the_proxies_in_front_of_envoy(stack_of):
    # The shipped envoy.yaml has use_remote_address: true, so Envoy appends the peer (here
    # the load balancer, i.e. this test) before the filter runs. trusted_hops: 1 means
    # one trusted proxy in front: the client is the address that proxy wrote.
    ident = {"client": {"source": "xff", "trusted_hops": 1}}
    stack = stack_of(plugin(rule("per-client", ["client"], 1), identity=ident))
    alice = {"x-forwarded-for": "198.51.100.7"}
    bob = {"x-forwarded-for": "203.0.113.9"}
    assert stack.get(0, "/", alice)[0] == 200
    assert stack.get(0, "/", bob)[0] == 200, "bob shares the balancer's bucket with alice"
    assert stack.get(0, "/", alice)[0] == 429
    # A client-written entry further left changes nothing.
    spoofed = {"x-forwarded-for": "10.9.9.9, 198.51.100.7"}
    assert stack.get(0, "/", spoofed)[0] == 429
    keys = stack.redis("KEYS", "rl:per-client:*")
    assert sorted(keys) == ["rl:per-client:198.51.100.7", "rl:per-client:203.0.113.9"]


def test_a_tier_from_a_client_header_is_refused_at_load():
    ident = {"user": {"header": "x-user-id"}, "tier": {"header": "x-tier"}}
    tiered = dict(rule("per-user", ["user"], 2), tiers={"gold": {"requests": 1000, "per": "1h"}})
    assert "rules[0].tier_identity" in load_error(plugin(tiered, identity=ident))


def test_ipv6_clients_rotating_inside_their_64_share_one_bucket(stack_of):
    ident = {"client": {"source": "xff", "trusted_hops": 1}}
    stack = stack_of(plugin(rule("per-client", ["client"], 1), identity=ident))
    first = {"x-forwarded-for": "2001:db8:1:2::1"}
    assert stack.get(0, "/", first)[0] == 200
    for rotated in ["2001:db8:1:2::2", "2001:db8:1:2:ffff:1:2:3", "2001:DB8:1:2:0:0:0:9"]:
        assert stack.get(0, "/", {"x-forwarded-for": rotated})[0] == 429, rotated
    assert stack.get(0, "/", {"x-forwarded-for": "2001:db8:1:3::1"})[0] == 200


def test_a_repeated_identity_header_is_refused_not_ignored(stack_of):
    ident = {"user": {"header": "x-user-id"}}
    stack = stack_of(plugin(rule("per-user", ["user"], 1), identity=ident))
    assert stack.get(0, "/", {"x-user-id": "attacker"})[0] == 200
    assert stack.get(0, "/", {"x-user-id": "attacker"})[0] == 429

    # Neither slips out of its bucket nor spends the victim's.
    status, _, body = stack.get(0, "/", [("x-user-id", "victim"), ("x-user-id", "attacker")])
    assert status == 400 and "x-user-id header appears more than once" in body
    assert stack.get(0, "/", {"x-user-id": "victim"})[0] == 200
    assert stack.stats().get("rejected") == 1


def test_forwarded_for_sent_twice_reads_as_the_one_list_it_is(stack_of):
    ident = {"client": {"source": "xff", "trusted_hops": 1}}
    stack = stack_of(plugin(rule("per-client", ["client"], 1), identity=ident))
    # Envoy joins the copies ("6.6.6.6,198.51.100.7") and appends its own entry: the client
    # is still the entry the trusted proxy wrote, the last copy's.
    twice = [("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.7")]
    assert stack.get(0, "/", twice)[0] == 200
    assert stack.get(0, "/", {"x-forwarded-for": "198.51.100.7"})[0] == 429
    assert stack.redis("KEYS", "rl:per-client:*") == ["rl:per-client:198.51.100.7"]


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_only_gateways_with_the_token_reach_the_bridge(stack_of, tmp_path, transport):
    secret = "s3cret-Token_for.tests"
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    ident = {"user": {"header": "x-user-id"}}
    rules = [rule("per-user", ["user"], 2)]

    def gateway(token):
        config = plugin(*rules, identity=ident)
        config["backend"]["transport"] = transport
        if token:
            config["backend"]["token"] = token
        return stack_of(config, bridge_args=["--token-file", str(token_file)])

    stack = gateway(secret)
    alice = {"x-user-id": "alice"}
    assert [stack.get(0, "/", alice)[0] for _ in range(3)] == [200, 200, 429]
    assert secret not in stack.logs("envoy-0")
    # Anyone else who reaches the bridge is turned away and changes nothing: refilling
    # alice's empty bucket was the attack.
    refill = "rl:per-user:alice,9007199254740,9007199254740,1,1\n"
    status, _, _ = request(stack.bridge_port, "/v1/check", {"content-type": "text/plain"},
                           method="POST", body=refill.encode())
    assert status == 401
    assert stack.get(0, "/", alice)[0] == 429
    # A gateway with a wrong token gets its failure mode (closed: 503), never an answer.
    assert gateway("wrong-token").get(0, "/", alice)[0] == 503


def test_after_redis_comes_back_the_first_request_is_checked_not_failed(stack_of):
    stack = stack_of(plugin(rule("per-user", ["user"], 100), identity={"user": {"header": "x-user-id"}}))
    alice = {"x-user-id": "alice"}
    assert stack.get(0, "/", alice)[0] == 200
    stack.valkey.stop()
    assert stack.get(0, "/", alice)[0] == 503  # failure_mode closed, while it is down
    stack.start_valkey()
    # Back for the bridge: connected again to the restarted Valkey by itself (its
    # background pings, no check since); the 503 above, one failure of the breaker's 5,
    # left the gateway calling out.
    wait_for("the bridge connected to the restarted Valkey",
             lambda: "lib-name=redis-rs" in stack.redis("CLIENT", "LIST"), timeout=20)
    status, headers, _ = stack.get(0, "/", alice)
    assert status == 200, "the first request after Redis came back"
    # Valkey restarted empty: alice's bucket starts full again.
    assert headers["x-ratelimit-remaining"] == "99"


@pytest.mark.parametrize("framing", ["content-length", "chunked-with-trailers"])
def test_a_body_sent_while_the_check_is_out_never_takes_the_request_upstream_first(
        stack_of, framing):
    """Envoy hands a filter that stopped a request's headers that request's body: a filter
    that let the body go on would send the headers upstream with it, before the verdict.
    Both bindings pause the headers so that Envoy holds body and trailers back instead."""
    with LlmUpstream() as upstream:
        stack = stack_of(plugin(rule("per-user", ["user"], 1), failure_mode="closed",
                                timeout_ms=2000), gateways=1, upstream=upstream.port)
        assert stack.get(0, "/", {"x-user-id": "u"})[0] == 200
        started = upstream.started
        head, body = {
            "content-length": (b"content-length: 5\r\n", b"hello"),
            "chunked-with-trailers": (b"transfer-encoding: chunked\r\n",
                                      b"5\r\nhello\r\n0\r\nx-trailer: t\r\n\r\n"),
        }[framing]
        os.kill(stack.bridge.proc.pid, signal.SIGSTOP)
        try:
            with socket.create_connection(("127.0.0.1", stack.ports[0]), timeout=10) as client:
                client.sendall(b"POST / HTTP/1.1\r\nhost: x\r\nx-user-id: u\r\n" + head + b"\r\n")
                time.sleep(0.3)
                client.sendall(body)  # the check is still out: the bridge is stopped
                time.sleep(1.0)
                assert upstream.started == started, "the request went upstream before its verdict"
                answer = client.recv(200)
        finally:
            os.kill(stack.bridge.proc.pid, signal.SIGCONT)
        # No answer in 2 s: closed fails it, and it never reached the upstream.
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert upstream.started == started
