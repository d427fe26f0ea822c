"""Metered limits end to end: real Envoys in front of the OpenAI-compatible upstream of
testbed/llm_upstream.py, the real bridge and Valkey. A metered rule reserves tokens when a
request is checked and settles what the response measured (its JSON usage, a stream's last
usage event, or a usage header) when it ends: the tokens debited are the usage served,
exactly, across two gateways; a budget is exceeded by at most one request's overshoot;
parallel requests cannot share one reservation; and hostile bodies, or bodies cut short,
cost the rule's max, never the filter. The attacker's rows are test_metered_abuse.py's.

Buckets refill by a token a month at most, so what a test measures is what it spent."""

import http.client
import json
import threading
import time
from math import gcd
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule
from testbed.stack import bucket_units

STREAM = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
          "messages": [{"role": "user", "content": "hello"}]}
CHAT = {**STREAM, "stream": False}
MONTH_MS = 30 * 86_400_000


def metered(requests, reserve, debt=None, **meter):
    """A rule `tokens` per API key: `requests` tokens a month, the OpenAI usage metered."""
    spec = {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 1},
            "reserve": reserve, **meter}
    if debt is not None:
        spec["debt"] = debt
    return plugin(rule("tokens", ["api_key"], requests, per="30d", meter=spec))


@pytest.fixture
def upstream():
    with LlmUpstream() as up:
        yield up


def spent(stack, key, burst, rule="tokens"):
    """Tokens taken from rule `rule`'s bucket `key` of a `burst` that refills a month (units
    to tokens: den is the month in ms over the burst, reduced; below 0 the bucket owes)."""
    if stack.redis("EXISTS", f"rl:{rule}:{key}") == 0:
        return 0
    units = bucket_units(stack.redis_port, f"rl:{rule}:{key}")
    den = MONTH_MS // gcd(burst, MONTH_MS)
    return burst - units / den


def wait_settled(stack, count, timeout=20.0):
    """Until the gateways' `settled` counters add up to `count`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        total = sum(stack.stats(g).get("settled", 0) for g in range(len(stack.ports)))
        if total >= count:
            return total
        time.sleep(0.1)
    raise AssertionError(f"settled {total} of {count}")


def ask(stack, gateway, key, usage, streamed=True, **headers):
    prompt, completion = usage
    h = {"x-api-key": key, "x-test-prompt-tokens": str(prompt),
         "x-test-completion-tokens": str(completion), **headers}
    return stack.stream(gateway, body=STREAM if streamed else CHAT, headers=h)


def test_tokens_debited_equal_the_usage_served_across_two_gateways(stack_of, upstream):
    burst = 1_000_000
    stack = stack_of(metered(burst, reserve=500), gateways=2, upstream=upstream.port)
    usages = [(7 + i % 13, 3 + (i * 7) % 41) for i in range(240)]
    with ThreadPoolExecutor(48) as pool:
        got = list(pool.map(
            lambda iu: ask(stack, iu[0] % 2, "k1", iu[1], streamed=iu[0] % 3 != 0,
                           **{"x-test-chunks": "8"}),
            enumerate(usages)))
    assert [r.status for r in got] == [200] * len(usages)
    assert all(r.complete for r in got)
    served = sum(p + c for p, c in usages)
    assert upstream.tokens_served() == served
    wait_settled(stack, len(usages))
    # Exact: what the bucket lost is the usage served (the refill, 1/30 token a second,
    # adds less than one token over the test).
    assert abs(spent(stack, "k1", burst) - served) < 1, (spent(stack, "k1", burst), served)
    metered_tokens = sum(stack.stats(g).get("metered_tokens", 0) for g in range(2))
    assert metered_tokens == served



def test_a_usage_format_prices_each_class_exactly_across_two_gateways(stack_of, upstream):
    """`"usage": "openai-chat"` with cached prompt tokens free and reasoning tokens dearer
    than the rest of the completion: the bucket loses each response's classes at their
    weights, exactly, streamed or not."""
    burst = 1_000_000
    spec = {"usage": "openai-chat", "weights": {"output": 4, "cached_input": 0, "reasoning": 8},
            "reserve": 500}
    stack = stack_of(plugin(rule("tokens", ["api_key"], burst, per="30d", meter=spec)),
                     gateways=2, upstream=upstream.port)
    asked = [(20 + i % 7, 5 + i % 11, i % 20, i % 5) for i in range(40)]

    def one(i):
        prompt, completion, cached, reasoning = asked[i]
        return ask(stack, i % 2, "fmt", (prompt, completion), streamed=i % 2 == 0,
                   **{"x-test-cached-tokens": str(cached),
                      "x-test-reasoning-tokens": str(reasoning)})

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(len(asked))))
    assert [r.status for r in got] == [200] * len(asked)
    wait_settled(stack, len(asked))
    cost = sum((p - c) + 4 * (o - r) + 8 * r for p, o, c, r in asked)
    assert abs(spent(stack, "fmt", burst) - cost) < 1, (spent(stack, "fmt", burst), cost)
    assert sum(stack.stats(g).get("unmeasured", 0) for g in range(2)) == 0


# Each API's path (testbed/llm_apis.py), its request (streamed, not), and whether it
# reports reasoning apart from output.
APIS = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 1000, "stream": True},
                  {"model": "m", "max_tokens": 1000}, False),
    "openai-responses": ("/v1/responses", {"model": "m", "input": "hi", "stream": True},
                         {"model": "m", "input": "hi"}, True),
    "gemini": ("/v1beta/models/m:streamGenerateContent?alt=sse", {"contents": []},
               {"contents": []}, True),
    "bedrock-converse": ("/model/m/converse-stream", {"messages": []}, {"messages": []}, False),
}


@pytest.mark.parametrize("api", APIS)
def test_each_api_s_usage_format_settles_exactly_streamed_and_not(stack_of, upstream, api):
    """The API's own shapes, a stream's usage split or repeated across its events as that
    API does: the bucket loses the usage at the classes' weights, exactly, on two gateways."""
    path, stream, body, reasoning_apart = APIS[api]
    weights = {"output": 3, "cached_input": 0, **({"reasoning": 5} if reasoning_apart else {})}
    burst = 1_000_000
    spec = {"usage": api, "weights": weights, "reserve": 500}
    stack = stack_of(plugin(rule("tokens", ["api_key"], burst, per="30d", meter=spec)),
                     gateways=2, upstream=upstream.port)
    asked = [(30 + i % 7, 6 + i % 11, i % 25, i % 5) for i in range(16)]
    cost = 0
    for i, (prompt, completion, cached, reasoning) in enumerate(asked):
        streamed = stream is not None and i % 2 == 0
        p = path if streamed else path.replace(
            ":streamGenerateContent?alt=sse", ":generateContent").replace(
            "/converse-stream", "/converse")
        got = stack.stream(i % 2, p, body=stream if streamed else body, headers={
            "x-api-key": "apis", "x-test-prompt-tokens": str(prompt),
            "x-test-completion-tokens": str(completion), "x-test-cached-tokens": str(cached),
            "x-test-reasoning-tokens": str(reasoning), "x-test-chunks": "4"})
        assert got.status == 200 and got.complete, (p, got.status)
        r = reasoning if reasoning_apart else 0
        cost += (prompt - cached) + 3 * (completion - r) + 5 * r
    wait_settled(stack, len(asked))
    assert sum(stack.stats(g).get("unmeasured", 0) for g in range(2)) == 0
    assert abs(spent(stack, "apis", burst) - cost) < 1, (spent(stack, "apis", burst), cost)

def test_a_budget_is_exceeded_by_at_most_one_requests_overshoot(stack_of, upstream):
    burst, reserve = 1000, 100
    stack = stack_of(metered(burst, reserve=reserve, debt=1000), gateways=1,
                     upstream=upstream.port)
    used, settled = 0, 0
    statuses = []
    for _ in range(8):
        r = ask(stack, 0, "k2", (150, 150))
        statuses.append(r.status)
        if r.status == 200:
            used += 300
            settled += 1
            wait_settled(stack, settled)
    # 300 a request against a reservation of 100: 4 pass (1200 tokens, 200 past the
    # budget, one request's overshoot), then the bucket owes and refuses.
    assert statuses == [200] * 4 + [429] * 4, statuses
    assert used - burst <= 300 - reserve
    # The last one took 200 on credit (199 whole ones if the refill had added a fraction).
    assert stack.stats(0).get("debt", 0) in (199, 200)


def test_a_metered_rules_headers_count_its_tokens_as_reserved_and_settled(stack_of, upstream):
    burst = 1000
    stack = stack_of(metered(burst, reserve=100, debt=1000), gateways=1, upstream=upstream.port)
    first = ask(stack, 0, "k9", (400, 200))
    # The fields are the bucket's in tokens as the check left it: 100 reserved of 1000.
    assert first.status == 200
    limit, left = first.headers["x-ratelimit-limit"], first.headers["x-ratelimit-remaining"]
    assert (limit, left) == ("1000", "900")
    wait_settled(stack, 1)
    # 600 used, 500 more than reserved: the next reservation leaves 1000 - 600 - 100.
    second = ask(stack, 0, "k9", (500, 500))
    assert (second.status, second.headers["x-ratelimit-remaining"]) == (200, "300")
    wait_settled(stack, 2)
    # 1000 used against 100 reserved: the bucket owes 600, and the next request waits for
    # the refill (1000 tokens in 30 days, one every 2,592 s) to repay it and reserve 100.
    third = ask(stack, 0, "k9", (1, 1))
    assert (third.status, third.headers["x-ratelimit-remaining"]) == (429, "0")
    assert abs(int(third.headers["retry-after"]) - 700 * 2592) <= 2


def test_parallel_streams_cannot_all_pass_on_one_reservation(stack_of, upstream):
    stack = stack_of(metered(1000, reserve=400), gateways=2, upstream=upstream.port)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(ask, stack, i % 2, "k3", (1, 1), **{"x-test-hold": "h"})
                   for i in range(6)]
        # Two are held open at the upstream; the others are answered meanwhile.
        deadline = time.monotonic() + 10
        while sum(f.done() for f in futures) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        upstream.release("h", 6)
        statuses = sorted(f.result().status for f in futures)
    # 1000 tokens hold two reservations of 400, not three, while the streams are open.
    assert statuses == [200, 200, 429, 429, 429, 429], statuses


@pytest.mark.parametrize("kind", ["huge-number", "negative", "string", "deep", "garbage",
                                  "truncated", "no-usage"])
def test_a_hostile_body_costs_the_max_and_never_the_filter(stack_of, upstream, kind):
    burst, most = 10_000, 300
    reserve = {"header": "x-max-tokens", "default": 100, "max": most}
    stack = stack_of(metered(burst, reserve=reserve), gateways=1, upstream=upstream.port)
    before = 0
    for n, streamed in enumerate((False, True)):
        r = ask(stack, 0, "k4", (5, 5), streamed=streamed, **{"x-test-body": kind})
        assert r.status == 200
        # What the meter cannot read in full costs the most it could have: the max.
        wait_settled(stack, n + 1)
        cost = spent(stack, "k4", burst) - before
        before += cost
        assert abs(cost - most) < 1, (streamed, cost)
    assert stack.stats(0).get("unmeasured") == 2
    # The filter still meters the next response exactly.
    good = ask(stack, 0, "k4", (20, 30))
    assert good.status == 200 and good.complete
    wait_settled(stack, 3)
    assert abs(spent(stack, "k4", burst) - before - 50) < 1


def test_a_response_cut_short_is_charged_the_max_or_what_it_showed(stack_of, upstream):
    burst = 10_000
    reserve = {"header": "x-max-tokens", "default": 100, "max": 300}
    stack = stack_of(metered(burst, reserve=reserve), gateways=1, upstream=upstream.port)
    cut = ask(stack, 0, "k5", (40, 60), **{"x-test-chunks": "4", "x-test-abort-after": "2"})
    assert not cut.complete
    # The usage event is the fifth: it came before the cut, which may have lost what
    # followed it all the same.
    late = ask(stack, 0, "k5", (40, 60), **{"x-test-chunks": "4", "x-test-abort-after": "5"})
    assert not late.complete
    # A usage of 400 shown before a cut is more than the max: it is charged.
    more = ask(stack, 0, "k5", (150, 250), **{"x-test-chunks": "4", "x-test-abort-after": "5"})
    assert not more.complete
    wait_settled(stack, 3)
    assert abs(spent(stack, "k5", burst) - (300 + 300 + 400)) < 1
    assert stack.stats(0).get("unmeasured") == 3


def peak_rss(pid):
    """A process's peak resident memory so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_gigabyte_stream_passes_with_bounded_memory_and_is_settled(stack_of, upstream):
    burst = 10_000
    stack = stack_of(metered(burst, reserve=300), gateways=1, upstream=upstream.port)
    envoy = stack.envoys[0].proc.pid
    ask(stack, 0, "k6", (1, 1), streamed=False)  # the filter and Envoy warmed up
    wait_settled(stack, 1)
    before = peak_rss(envoy)
    r = ask(stack, 0, "k6", (70, 30), **{"x-test-body": "gigabyte",
                                         "x-test-bytes": str(1 << 30)})
    assert r.status == 200 and r.complete and r.size >= 1 << 30
    wait_settled(stack, 2)
    assert abs(spent(stack, "k6", burst) - 102) < 1
    # Buffering the stream anywhere in the gateway (the filter's memory included) would
    # raise its peak by the gigabyte.
    grown = peak_rss(envoy) - before
    assert grown < 64 << 20, f"Envoy's peak memory grew by {grown >> 20} MiB"


def test_a_request_header_sets_the_reservation_within_its_bound_and_a_usage_header_decides(
        stack_of, upstream):
    burst = 10_000
    plugin_ = metered(burst, reserve={"header": "x-max-tokens", "default": 100, "max": 2000},
                      header="x-usage-tokens")
    stack = stack_of(plugin_, gateways=1, upstream=upstream.port)
    got = []
    held = threading.Thread(target=lambda: got.append(ask(
        stack, 0, "k7", (1, 1), **{"x-max-tokens": "5000", "x-test-hold": "h7"})))
    held.start()
    deadline = time.monotonic() + 10
    while spent(stack, "k7", burst) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    # While its stream is open it holds what it asked for, at most the meter's max.
    assert abs(spent(stack, "k7", burst) - 2000) < 1
    upstream.release("h7")
    held.join(15)
    assert got[0].status == 200
    r = ask(stack, 0, "k7", (10, 10), **{"x-test-usage-header": "12"})
    assert r.status == 200
    wait_settled(stack, 2)
    # The first settled its usage (2), the second its header (12).
    assert abs(spent(stack, "k7", burst) - 14) < 1


def send_in_parts(port, parts, headers, pause=0.2):
    """A POST whose body is sent chunked, `parts` apart by `pause` seconds: the gateway
    sees it come in pieces. Returns (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        for name, value in {"content-type": "application/json",
                            "transfer-encoding": "chunked", **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        for part in parts:
            conn.send(b"%x\r\n%s\r\n" % (len(part), part))
            time.sleep(pause)
        conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_a_reservation_asked_in_the_request_body_is_read_whole_and_bounded(stack_of, upstream):
    burst = 10_000
    reserve = {"body": ["max_tokens", "max_completion_tokens"], "default": 100, "max": 2000}
    stack = stack_of(metered(burst, reserve=reserve), gateways=1, upstream=upstream.port)
    usage = {"x-test-prompt-tokens": "1", "x-test-completion-tokens": "1"}
    body = json.dumps({**STREAM, "max_tokens": 50}).encode()
    # The field that asks most comes last, in the body's third piece.
    cases = [("k8", [body[:-1], b', "max_completion_', b'tokens": 700}'], 700),
             ("k9", [json.dumps({**STREAM, "max_tokens": 10**30}).encode()], 2000),
             ("k10", [json.dumps({**STREAM, "max_tokens": 1_000_000}).encode()], 2000)]
    for n, (key, parts, expected) in enumerate(cases):
        got = []
        held = threading.Thread(target=lambda: got.append(send_in_parts(
            stack.ports[0], parts, {"x-api-key": key, "x-test-hold": key, **usage})))
        held.start()
        deadline = time.monotonic() + 10
        while spent(stack, key, burst) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # While its stream is open it holds what its body asked, at most max (a number
        # too large to be a count may be read otherwise upstream: the max).
        assert abs(spent(stack, key, burst) - expected) < 1, (key, spent(stack, key, burst))
        upstream.release(key)
        held.join(15)
        status, headers, answer = got[0]
        # The upstream read the whole body as JSON (a stream was asked) and streamed.
        assert status == 200 and headers["content-type"] == "text/event-stream", answer
        assert b"[DONE]" in answer
        wait_settled(stack, n + 1)
        assert abs(spent(stack, key, burst) - 2) < 1
    # A request without a body reserves the default and is not held back for one.
    r = ask(stack, 0, "k11", (3, 4), streamed=False)
    assert r.status == 200 and r.complete
    # A body past Envoy's buffer limit is refused by Envoy (413), the bucket untouched.
    huge = b'{"pad": "' + b"x" * (2 << 20) + b'", "max_tokens": 5}'
    status, _, _ = send_in_parts(stack.ports[0], [huge], {"x-api-key": "k12"}, pause=0)
    assert status == 413
    assert spent(stack, "k12", burst) == 0
