"""In-flight limits in real Envoy, two gateways, the real bridge and Valkey, in front of
testbed/llm_upstream.py streaming server-sent events as an LLM API does: at most `max`
streams of one key at once across both gateways (judged by testbed/in_flight.py on every
admission and end the upstream saw, which catches per-gateway limits), a slot back however
its stream ends, and a killed gateway's slots back within their `ttl`."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.in_flight import DENY_CACHE_S, SLACK_S, freed_in_time, judge
from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
IDENTITY = {"user": {"header": "x-user-id"}, "gw": {"header": "x-gateway"}}


def streams_rule(max_, ttl="3s", key=("user",)):
    return {"name": "streams", "key": list(key), "in_flight": {"max": max_, "ttl": ttl}}


def in_flight_plugin(*rules):
    return plugin(*rules, identity=IDENTITY)


@pytest.fixture
def upstream():
    with LlmUpstream() as up:
        yield up


def ask(stack, gateway, user, **headers):
    """One stream through `gateway`: 8 events 100 ms apart, unless `headers` say otherwise."""
    sent = {"x-user-id": user, "x-gateway": str(gateway), "x-test-chunks": "8",
            "x-test-chunk-delay-ms": "100", **headers}
    return stack.stream(gateway, body=STREAM, headers=sent)


def flood(stack, user, waves=3, per_wave=24):
    """Waves of `per_wave` streams at once, alternating gateways, a second apart: the
    answers' statuses."""
    statuses = []
    for _ in range(waves):
        # A client denied is refused by its gateway's deny cache for a second.
        time.sleep(DENY_CACHE_S)
        with ThreadPoolExecutor(per_wave) as pool:
            answers = list(pool.map(lambda i: ask(stack, i % 2, user), range(per_wave)))
        for a in answers:
            assert a.status in (200, 429), (a.status, a.body[:200])
            if a.status == 429:
                assert a.headers.get("retry-after") == "1", a.headers
                assert b"requests in flight, the most allowed" in a.body, a.body
            else:
                assert a.complete, a.error
                assert a.headers.get("x-ratelimit-limit") == "3", a.headers
        statuses += [a.status for a in answers]
    return statuses


def served_intervals(upstream, user):
    return [(s.at, s.ended) for s in upstream.served if s.headers.get("x-user-id") == user]


def test_two_gateways_hold_at_most_max_streams_of_a_key_between_them(stack_of, upstream):
    stack = stack_of(in_flight_plugin(streams_rule(3), rule("rate", ["user"], 10_000, "1m")),
                     gateways=2, upstream=upstream.port)
    statuses = flood(stack, "alice")
    verdict = judge(served_intervals(upstream, "alice"), 3)
    assert verdict.violations == [], verdict
    assert verdict.most == 3, f"the limit was never reached: {verdict}"
    assert statuses.count(200) >= 9 and statuses.count(429) >= 9, statuses
    # Every slot came back: the next three are admitted at once, the fourth is not.
    time.sleep(DENY_CACHE_S)
    held = {"x-test-hold": "alice-after"}
    with ThreadPoolExecutor(3) as pool:
        three = [pool.submit(ask, stack, i % 2, "alice", **held) for i in range(3)]
        upstream_waits = time.monotonic() + 10
        while upstream.holding("alice-after") < 3 and time.monotonic() < upstream_waits:
            time.sleep(0.02)
        assert upstream.holding("alice-after") == 3
        assert ask(stack, 1, "alice").status == 429
        upstream.release("alice-after", 3)
        assert [f.result().status for f in three] == [200] * 3
    counters = stack.stats(0)
    assert counters.get("slots_taken", 0) >= 1 and counters.get("slots_released", 0) >= 1, \
        counters


def test_the_checker_catches_a_limit_each_gateway_keeps_for_itself(stack_of, upstream):
    # The negative control: the same streams, each gateway counting its own (keyed on the
    # gateway too, as a local limit would): together they exceed the bound.
    stack = stack_of(in_flight_plugin(streams_rule(3, key=("user", "gw"))),
                     gateways=2, upstream=upstream.port)
    flood(stack, "mallory", waves=2)
    verdict = judge(served_intervals(upstream, "mallory"), 3)
    assert verdict.most > 3 and verdict.violations, verdict


def test_a_slot_comes_back_however_its_stream_ends(stack_of, upstream):
    # A slot lives 30 s unrenewed: any that leaked would refuse the next requests.
    stack = stack_of(in_flight_plugin(streams_rule(2, ttl="30s")), gateways=2,
                     upstream=upstream.port)
    endings = {
        "completed": {},
        "upstream reset mid-stream": {"x-test-abort-after": "2"},
        "upstream refused": {"x-test-body": "no-such-kind"},
    }
    for ending, headers in endings.items():
        answers = [ask(stack, i, "bob", **headers) for i in range(2)]
        assert all(a.status in (200, 400) for a in answers), (ending, answers)
        both_fit(stack, upstream, "bob", ending)
    # A client that goes away mid-stream: its stream ends when Envoy sees it gone.
    for i in range(2):
        gone = stack.stream(i, body=STREAM, headers={
            "x-user-id": "bob", "x-test-chunks": "50", "x-test-chunk-delay-ms": "100"},
            on_chunk=lambda n, _: n < 1)
        assert gone.stopped, gone
    both_fit(stack, upstream, "bob", "client gone")


def both_fit(stack, upstream, user, after):
    """Two streams of `user` are admitted at once, one on each gateway, and a third is not:
    the slots the previous two held came back."""
    name = f"{user}-{after}"
    deadline = time.monotonic() + 5  # what a release takes: a round trip, not a ttl
    with ThreadPoolExecutor(2) as pool:
        two = [pool.submit(ask, stack, i, user, **{"x-test-hold": name}) for i in range(2)]
        while upstream.holding(name) < 2 and time.monotonic() < deadline:
            if any(f.done() for f in two):
                break
            time.sleep(0.02)
        admitted = upstream.holding(name)
        third = ask(stack, 0, user, **{"x-test-chunks": "1"}).status if admitted == 2 else None
        upstream.release(name, 2)
        statuses = [f.result().status for f in two]
    assert statuses == [200, 200], f"after a stream {after}: {statuses}"
    assert third == 429, f"after a stream {after}: the limit is gone ({third})"
    time.sleep(DENY_CACHE_S)


def test_a_killed_gateway_s_slots_come_back_within_their_ttl(stack_of, upstream):
    assert killed_and_freed(stack_of, upstream, "3s", 3.0) is None


def test_the_checker_catches_slots_that_outlive_their_bound(stack_of, upstream):
    # The negative control: slots that live an hour are still held past the 3 s bound.
    reason = killed_and_freed(stack_of, upstream, "1h", 3.0)
    assert reason is not None and "never admitted" in reason, reason


def killed_and_freed(stack_of, upstream, ttl, bound_s):
    """Gateway 0 holds both of carol's slots on streams that outlive `ttl` (so renewals
    keep them), then is killed; gateway 1 asks every 100 ms. What `freed_in_time` says of
    the first admission against `bound_s`."""
    stack = stack_of(in_flight_plugin(streams_rule(2, ttl=ttl)), gateways=2,
                     upstream=upstream.port)
    name = f"carol-{ttl}"
    threads = [threading.Thread(target=ask, args=(stack, 0, "carol"),
                                kwargs={"x-test-hold": name}, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while upstream.holding(name) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.holding(name) == 2
    # Past the slots' first life, renewed: still held.
    time.sleep(bound_s + 0.5)
    assert ask(stack, 1, "carol", **{"x-test-chunks": "1"}).status == 429
    stack.envoys[0].kill()
    killed = time.monotonic()
    admitted = None
    while time.monotonic() < killed + bound_s + DENY_CACHE_S + SLACK_S:
        if ask(stack, 1, "carol", **{"x-test-chunks": "1"}).status == 200:
            admitted = time.monotonic()
            break
        time.sleep(0.1)
    upstream.release(name, 2)
    return freed_in_time(killed, admitted, bound_s)


# A metered rule reserving 1 token of 1,000 and an answer costing 1,004: each request in
# flight may cost C - R = 1,003 past its reservation.
BURST, COST, RESERVE = 1000, 1004, 1
METERED = rule("tokens", ["user"], BURST, per="30d",
               meter={"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 1},
                      "reserve": RESERVE})


@pytest.mark.parametrize("cap", [2, None], ids=["two-in-flight", "no-cap-negative-control"])
def test_an_in_flight_cap_bounds_what_a_metered_key_is_served(stack_of, upstream, cap):
    # docs/in-flight.md: a key may consume B + r·t + N·(C - R); the cap makes N its max. The
    # negative control, the metered rule alone, lets every parallel request through.
    rules = [METERED, streams_rule(cap)] if cap else [METERED]
    stack = stack_of(in_flight_plugin(*rules), gateways=2, upstream=upstream.port)
    user = f"dave-{cap}"
    costly = {"x-test-prompt-tokens": "4", "x-test-completion-tokens": str(COST - 4)}
    body = {**STREAM, "stream_options": {"include_usage": True}}
    for _ in range(2):
        time.sleep(DENY_CACHE_S)
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: stack.stream(i % 2, body=body, headers={
                "x-user-id": user, "x-test-chunks": "5", "x-test-chunk-delay-ms": "100",
                **costly}), range(20)))
        assert all(a.status in (200, 429) for a in answers), [a.status for a in answers]
    served = sum(s.total for s in upstream.served if s.headers.get("x-user-id") == user)
    bound = BURST + 2 * (COST - RESERVE)  # the refill over a minute of a month: < 1 token
    if cap:
        assert 0 < served <= bound, (served, bound)
        assert judge(served_intervals(upstream, user), cap).violations == []
    else:
        assert served > bound, (served, bound)
