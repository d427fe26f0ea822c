"""A metered client must never pay less than it consumed: the fourth attacker's review
(issue 38), each row as the attacker ran it, in real Envoy with the real bridge and Valkey,
in front of testbed/llm_upstream.py, which behaves like OpenAI's API where metering depends
on it: it gzips JSON for a client that accepts gzip, streams usage only when the request
asks for it, and reads `max_tokens` as Python's json and pydantic do.

The rule under attack: 1,000 tokens per API key, prompt tokens x1, completion tokens x4,
a reservation read from the body's `max_tokens` (default 100, at most 1,000). A response of
200 prompt and 100 completion tokens costs 600. What a response's meter cannot read in full
is charged the rule's `max` (or more, where the response shows more); what it can is charged
exactly, however far below 0 that takes the bucket. The bucket refills over 30 days, so
what a test measures is what was charged."""

import gzip
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule
from testbed.tests.test_metered import send_in_parts, spent, wait_settled

BURST, DEFAULT, MAX = 1000, 100, 1000
WEIGHTS = {"prompt": 1, "completion": 4}
METER = {"body": {"usage.prompt_tokens": WEIGHTS["prompt"],
                  "usage.completion_tokens": WEIGHTS["completion"]},
         "reserve": {"body": ["max_tokens"], "default": DEFAULT, "max": MAX}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
STREAM = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
COSTS_600 = {"x-test-prompt-tokens": "200", "x-test-completion-tokens": "100"}


def tokens_rule(**extra):
    return plugin(rule("tokens", ["api_key"], BURST, per="30d", meter=METER), **extra)


@pytest.fixture
def upstream():
    with LlmUpstream() as up:
        yield up


def charged(stack, key, expected, timeout=10.0):
    """What bucket `key` was charged, once it is `expected` (or `timeout` seconds later: a
    settlement that never comes leaves the reservation)."""
    deadline = time.monotonic() + timeout
    while (got := spent(stack, key, BURST)) < expected - 0.5 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # nothing more comes
    return spent(stack, key, BURST)


def ask(stack, key, body, gateway=0, on_chunk=None, **headers):
    return stack.stream(gateway, body=body, headers={"x-api-key": key, **COSTS_600, **headers},
                        on_chunk=on_chunk)


def test_row1_a_client_accepting_gzip_pays_its_usage(stack_of, upstream):
    stack = stack_of(tokens_rule(), upstream=upstream.port)
    r = ask(stack, "gz", CHAT, **{"accept-encoding": "gzip, deflate, br"})
    assert r.status == 200, r.body
    # The filter asked the upstream for the identity coding: it answered plain JSON, and the
    # meter read its usage, exactly.
    assert upstream.served[-1].encoding is None
    assert json.loads(r.body)["usage"]["completion_tokens"] == 100
    assert charged(stack, "gz", 600) == pytest.approx(600, abs=0.5)
    # An upstream that compresses anyway cannot be read: the rule's max.
    r = ask(stack, "gz2", CHAT, **{"x-test-encoding": "gzip"})
    assert r.status == 200 and r.headers["content-encoding"] == "gzip"
    assert charged(stack, "gz2", MAX) == pytest.approx(MAX, abs=0.5)


COMPRESSOR = {"name": "envoy.filters.http.compressor", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
    "response_direction_config": {"common_config": {"min_content_length": 10,
                                                    "content_type": ["application/json"]}},
    "compressor_library": {"name": "gzip", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip"}}}}


def test_row1_envoys_compressor_before_the_filter_still_compresses_for_the_client(
        stack_of, upstream):
    # docs/configuration.md's advice: the compressor first in http_filters sees the client's
    # Accept-Encoding, and compresses the response after the meter read it plain.
    stack = stack_of(tokens_rule(), upstream=upstream.port, filters_before=[COMPRESSOR])
    r = ask(stack, "zip", CHAT, **{"accept-encoding": "gzip"})
    assert r.status == 200 and r.headers.get("content-encoding") == "gzip", r.headers
    assert json.loads(gzip.decompress(r.body))["usage"]["prompt_tokens"] == 200
    assert upstream.served[-1].encoding is None
    assert charged(stack, "zip", 600) == pytest.approx(600, abs=0.5)


def test_row2_a_stream_that_reports_no_usage_pays_the_max(stack_of, upstream):
    stack = stack_of(tokens_rule(), upstream=upstream.port)
    silent = {**CHAT, "stream": True}  # the API's default: no usage in the stream
    r = ask(stack, "quiet", silent)
    assert r.status == 200 and r.complete and b"[DONE]" in r.body
    assert not upstream.served[-1].usage_sent
    assert charged(stack, "quiet", MAX) == pytest.approx(MAX, abs=0.5)
    # The same stream asking for its usage pays exactly that.
    r = ask(stack, "told", STREAM)
    assert r.status == 200 and upstream.served[-1].usage_sent
    assert charged(stack, "told", 600) == pytest.approx(600, abs=0.5)


def test_row3_parallel_requests_owe_all_they_consumed(stack_of, upstream):
    stack = stack_of(tokens_rule(), gateways=2, upstream=upstream.port)
    body = {**STREAM, "max_tokens": 1}  # reserves 1; each response costs 1000 + 4 x 1
    headers = {"x-test-prompt-tokens": "1000", "x-test-completion-tokens": "100",
               "x-test-hold": "all"}
    n = 40
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(lambda i=i: stack.stream(i % 2, body=body, headers={
            "x-api-key": "par", **headers})) for i in range(n)]
        # Every request is admitted (its stream held before its usage) or refused before
        # any response ends.
        deadline = time.monotonic() + 20
        while upstream.holding("all") + sum(f.done() for f in futures) < n and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        upstream.release("all", n)
        results = [f.result() for f in futures]
    admitted = sum(r.status == 200 for r in results)
    assert admitted == len(upstream.served) and admitted > 1
    consumed = upstream.tokens_consumed(**WEIGHTS)
    assert consumed == 1004 * admitted
    wait_settled(stack, admitted)
    # Owed in full: the bucket is `consumed - burst` below 0, nothing forgiven.
    assert spent(stack, "par", BURST) == pytest.approx(consumed, abs=0.5)
    # And refused until the refill (1,000 tokens in 30 days: one every 2,592 s) repays it
    # and holds the next reservation (the default, 100).
    r = ask(stack, "par", CHAT)
    assert r.status == 429
    owed = consumed - BURST
    assert abs(int(r.headers["retry-after"]) - (owed + DEFAULT) * 2592) <= 3


def test_row4_a_client_leaving_before_the_usage_event_pays_the_max(stack_of, upstream):
    stack = stack_of(tokens_rule(), upstream=upstream.port)
    seen = bytearray()

    def until_the_last_content_event(_, data):
        seen.extend(data)
        return seen.count(b"data: ") < 5  # then the client closes

    r = ask(stack, "early", STREAM, on_chunk=until_the_last_content_event,
            **{"x-test-chunks": "5", "x-test-hold": "usage"})
    assert r.stopped and seen.count(b"data: ") == 5
    upstream.release("usage")
    upstream.wait_served(1)
    assert charged(stack, "early", MAX) == pytest.approx(MAX, abs=0.5)


# Each a stream's request (so that its response can be held open), asking for 900 tokens
# as the upstream reads it.
STREAMED = '{"stream": true, "stream_options": {"include_usage": true}, '
HOSTILE_BODIES = {
    "nan": (STREAMED + '"max_tokens": 1, "x": NaN, "max_tokens": 900}').encode(),
    "-infinity": (STREAMED + '"max_tokens": 1, "x": -Infinity, "max_tokens": 900}').encode(),
    "repeated": (STREAMED + '"max_tokens": 1, "max_tokens": 900}').encode(),
    "exponent": (STREAMED + '"max_tokens": 9e2}').encode(),
    "fraction": (STREAMED + '"max_tokens": 900.0}').encode(),
    "string": (STREAMED + '"max_tokens": "900"}').encode(),
    "bom": b"\xef\xbb\xbf" + (STREAMED + '"max_tokens": 900}').encode(),
    "utf-16": (STREAMED + '"max_tokens": 900}').encode("utf-16"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_row5_a_body_read_otherwise_than_the_upstream_reads_it_reserves_the_max(
        stack_of, upstream, name):
    stack = stack_of(tokens_rule(), upstream=upstream.port)
    body = HOSTILE_BODIES[name]
    got = []
    held = threading.Thread(target=lambda: got.append(send_in_parts(
        stack.ports[0], [body], {"x-api-key": name, "x-test-hold": name,
                                 "x-test-prompt-tokens": "1"}, pause=0)))
    held.start()
    deadline = time.monotonic() + 10
    while spent(stack, name, BURST) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    # While its response is out it holds the rule's max: the upstream may generate 900.
    assert spent(stack, name, BURST) == pytest.approx(MAX, abs=0.5)
    upstream.release(name)
    held.join(15)
    assert got[0][0] == 200
    assert upstream.served[-1].max_tokens == 900


def test_row6_local_buckets_are_charged_what_responses_consumed(stack_of, upstream):
    stack = stack_of(tokens_rule(failure_mode="local"), upstream=upstream.port)
    stack.bridge.stop()
    statuses = [ask(stack, "outage", CHAT).status for _ in range(10)]
    # 1000 local tokens: 900 left after the first reservation, 400 after its settlement;
    # 300, then -200 after the second's: the third is refused.
    assert statuses == [200, 200] + [429] * 8, statuses
    consumed = upstream.tokens_consumed(**WEIGHTS)
    assert consumed <= BURST + (600 - DEFAULT)


def test_row7_a_client_known_over_its_limit_is_refused_before_the_upstream(stack_of, upstream):
    stack = stack_of(tokens_rule(), upstream=upstream.port)
    # 1400 used against 100 reserved: 400 owed.
    r = ask(stack, "over", CHAT, **{"x-test-prompt-tokens": "1000"})
    assert r.status == 200
    wait_settled(stack, 1)
    # Its next request is checked once its body is read, its headers gone upstream (an
    # upstream request opened, then reset): the bridge denies it, the worker remembers.
    assert ask(stack, "over", {**CHAT, "max_tokens": 10}).status == 429
    started = upstream.started
    for asked in (10, 1, 500, None):
        body = {**CHAT, "max_tokens": asked} if asked else CHAT
        r = ask(stack, "over", body)
        assert r.status == 429 and int(r.headers["retry-after"]) > 0
    # Known over its limit for any reservation: refused at its headers, none went upstream.
    assert upstream.started == started
    assert len(upstream.served) == 1
