"""Calendar quotas (docs/calendar-quotas.md) in real Envoy, two gateways, the real bridge and
Valkey: a month's quota in a named time zone is counted exactly across both gateways beside
a token bucket, refused with `Retry-After` and `X-RateLimit-Reset` at the month's end in
that zone (as Python's zoneinfo computes it), full again once its period is over, metered
from the responses' usage, and read through the quota API with its period."""

import json
import struct
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import valkey

from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule

IDENTITY = {"user": {"header": "x-user-id"}}
ZONE = "Pacific/Auckland"
STREAM = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
          "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def upstream():
    with LlmUpstream() as up:
        yield up


def month_bounds(zone, now=None):
    """The start and end (Unix s) of the month holding `now` in `zone`."""
    local = datetime.fromtimestamp(now or time.time(), ZoneInfo(zone))
    start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start.timestamp(), end.timestamp()


def monthly(requests, **extra):
    return {"name": "monthly", "key": ["user"], "time_zone": ZONE,
            "limit": {"requests": requests, "per": "month"}, **extra}


def last_spent_before(stack, key, instant_s):
    """Rewrites the stored quota `key` as if last spent at `instant_s`: what the next
    request finds once its period has passed (the script's '<Bddd' then the quota's size:
    tag, level, ms, den, capacity)."""
    client = valkey.Valkey(host="127.0.0.1", port=stack.redis_port, socket_timeout=5)
    try:
        raw = client.get(key)
        tag, level, _, den = struct.unpack_from("<Bddd", raw)
        head = struct.pack("<Bddd", tag, level, instant_s * 1000, den)
        client.set(key, head + raw[struct.calcsize("<Bddd"):], keepttl=True)
    finally:
        client.close()


def test_a_months_quota_is_exact_across_gateways_and_refuses_until_the_month_ends(stack_of):
    stack = stack_of(plugin(monthly(5), rule("rate", ["user"], 100, "1m"), identity=IDENTITY),
                     gateways=2)
    _, end = month_bounds(ZONE)
    seen = []
    for i in range(5):
        status, headers, _ = stack.get(i % 2, "/", {"x-user-id": "alice"})
        assert status == 200
        seen.append(int(headers["x-ratelimit-remaining"]))
        # The quota's reset is the month's end in its zone, however much is left.
        assert headers["x-ratelimit-limit"] == "5"
        assert abs(int(headers["x-ratelimit-reset"]) - end) <= 2
    assert seen == [4, 3, 2, 1, 0], "both gateways spend one count"
    for gateway in (0, 1):
        status, headers, body = stack.get(gateway, "/", {"x-user-id": "alice"})
        assert status == 429
        assert abs(int(headers["retry-after"]) - (end - time.time())) <= 3, headers
        assert "5 requests per month" in body
    # Another client's quota is its own.
    assert stack.get(0, "/", {"x-user-id": "bob"})[0] == 200
    assert stack.get(1, "/", {"x-user-id": "bob"})[1]["x-ratelimit-remaining"] == "3"


def test_a_quota_last_spent_in_an_earlier_month_is_full_again(stack_of):
    stack = stack_of(plugin(monthly(3), identity=IDENTITY), gateways=2)
    for i in range(3):
        assert stack.get(i % 2, "/", {"x-user-id": "carol"})[0] == 200
    assert stack.get(0, "/", {"x-user-id": "carol"})[0] == 429
    start, _ = month_bounds(ZONE)
    # Spent a second before this month began in Auckland: all 3 are back.
    last_spent_before(stack, "rl:monthly:carol", start - 1)
    status, headers, _ = stack.get(1, "/", {"x-user-id": "carol"})
    assert status == 200, headers
    assert headers["x-ratelimit-remaining"] == "2"
    # Spent a second after it began: this month's spending, still counted, although in
    # UTC (11 to 13 hours behind) that instant was still last month. (Through gateway 1:
    # gateway 0's refusal above is trusted there for a second.)
    last_spent_before(stack, "rl:monthly:carol", start + 1)
    assert stack.get(1, "/", {"x-user-id": "carol"})[1]["x-ratelimit-remaining"] == "1"


def test_a_metered_weekly_budget_is_settled_from_usage_and_read_through_the_quota_api(
        stack_of, upstream):
    budget = {"name": "budget", "key": ["user"], "limit": {"requests": 1000, "per": "week"},
              "match": {"path_prefix": "/v1/chat"},
              "meter": {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 1},
                        "reserve": 100}}
    stack = stack_of(plugin(budget, identity=IDENTITY, quota_api={"path": "/v1/quota"}),
                     gateways=2, upstream=upstream.port)
    for gateway, (prompt, completion) in enumerate([(300, 100), (150, 50)]):
        reply = stack.stream(gateway, body=STREAM, headers={
            "x-user-id": "dave", "x-test-prompt-tokens": str(prompt),
            "x-test-completion-tokens": str(completion)})
        assert reply.status == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if sum(stack.stats(g).get("settled", 0) for g in (0, 1)) >= 2:
            break
        time.sleep(0.1)
    status, _, body = stack.get(1, "/v1/quota", {"x-user-id": "dave"})
    assert status == 200
    (shown,) = json.loads(body)["rules"]
    assert (shown["limit"], shown["remaining"]) == (1000, 400), "600 tokens used, as served"
    assert (shown["period"], shown["time_zone"]) == ("week", "UTC")
    # Weeks start on Monday at midnight, UTC.
    today = datetime.now(ZoneInfo("UTC"))
    monday = (today - timedelta(days=today.weekday())).replace(
        hour=0, minute=0, second=0, microsecond=0)
    assert abs(shown["reset"] - (monday + timedelta(days=7)).timestamp()) <= 2
    assert "window" not in shown
