"""The quota API (docs/quota-api.md) in real Envoy, two gateways, the real bridge and Valkey:
a client reads every rule its own identities key, as both gateways spent it, spending
nothing but the quota API's own rule; its path never reaches the upstream, whatever its
spelling; a query names no other client; and it is rate limited itself."""

import json
import threading
import time

import pytest

from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule

IDENTITY = {"user": {"header": "x-user-id"}, "tier": {"header": "x-tier", "trusted": True}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def quota_plugin():
    return plugin(
        rule("quota-api", ["user"], 3, "1m", match={"path": "/v1/quota"}),
        rule("chat", ["user"], 100, "1m", match={"path_prefix": "/v1/chat"},
             tiers={"gold": {"requests": 1000, "per": "1m"}}),
        {"name": "streams", "key": ["user"], "in_flight": {"max": 2}},
        rule("shadowed", ["user"], 1, "1h", mode="shadow"),
        identity=IDENTITY, quota_api={"path": "/v1/quota"})


@pytest.fixture
def upstream():
    with LlmUpstream() as up:
        yield up


def quota(stack, gateway, user=None, path="/v1/quota", **headers):
    sent = {**({"x-user-id": user} if user else {}), **headers}
    status, got, body = stack.get(gateway, path, sent)
    return status, got, json.loads(body) if body else None


def by_name(answer):
    return {r["name"]: r for r in answer["rules"]}


def test_a_client_reads_its_quota_as_both_gateways_spent_it_spending_nothing(stack_of, upstream):
    stack = stack_of(quota_plugin(), gateways=2, upstream=upstream.port)
    for i in range(5):
        assert stack.stream(i % 2, body=CHAT, headers={"x-user-id": "alice"}).status == 200
    before = time.time()
    status, headers, answer = quota(stack, 1, "alice")
    assert status == 200, answer
    assert headers["content-type"] == "application/json"
    rules = by_name(answer)
    assert set(rules) == {"quota-api", "chat", "streams"}, "never a shadow rule"
    chat = rules["chat"]
    assert (chat["limit"], chat["remaining"], chat["window"]) == (100, 95, 60)
    assert before < chat["reset"] <= before + 61
    assert rules["streams"] == {"name": "streams", "in_flight": 2, "remaining": 2}
    assert rules["quota-api"]["remaining"] == 2, "a quota request is a request to its path"
    # Reading spent nothing of chat: after one more chat request, 94 are left.
    assert stack.stream(0, body=CHAT, headers={"x-user-id": "alice"}).status == 200
    rules = by_name(quota(stack, 0, "alice")[2])
    assert (rules["chat"]["remaining"], rules["quota-api"]["remaining"]) == (94, 1)
    assert not [s for s in upstream.served if "quota" in s.path]


def test_a_quota_shows_the_client_s_tier_and_its_streams_in_flight(stack_of, upstream):
    stack = stack_of(quota_plugin(), gateways=2, upstream=upstream.port)
    hold = threading.Thread(target=stack.stream, args=(0,), kwargs={
        "body": {**CHAT, "stream": True},
        "headers": {"x-user-id": "gil", "x-test-hold": "gil"}}, daemon=True)
    hold.start()
    deadline = time.monotonic() + 10
    while upstream.holding("gil") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    rules = by_name(quota(stack, 1, "gil", **{"x-tier": "gold"})[2])
    upstream.release("gil")
    assert rules["chat"]["limit"] == 1000
    assert rules["streams"]["remaining"] == 1, "one of its two slots held by its stream"


def test_no_spelling_of_the_path_reaches_the_upstream_and_no_query_names_another_client(
        stack_of, upstream):
    stack = stack_of(quota_plugin(), gateways=1, upstream=upstream.port)
    stack.stream(0, body=CHAT, headers={"x-user-id": "alice"})
    for i, path in enumerate(["/v1//quota", "/v1/./quota?user=alice", "/v1/%71uota",
                              "/v1/x/../quota"]):
        status, _, answer = quota(stack, 0, f"bob{i}", path=path)
        assert status == 200, (path, answer)
        assert by_name(answer)["chat"]["remaining"] == 100, f"{path}: bob's own, not alice's"
    assert not upstream.served[1:], [s.path for s in upstream.served]
    status, headers, _ = stack.get(0, "/v1/quota", {"x-user-id": "carol"}, method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    # A client with no identity reads no one's rule.
    status, _, answer = quota(stack, 0)
    assert status == 200 and answer == {"rules": []}


def test_the_quota_api_is_rate_limited_by_the_rules_of_its_path(stack_of, upstream):
    stack = stack_of(quota_plugin(), gateways=2, upstream=upstream.port)
    statuses = [quota(stack, i % 2, "dana")[0] for i in range(4)]
    assert statuses == [200, 200, 200, 429]
