"""The LLM upstream of testbed/llm_upstream.py behind a real Envoy (`Stack(upstream=...)`),
with no rule that applies: what the tests of metered limits stand on. The answers the test
chose arrive whole, a stream arrives event by event before it ends, an upstream reset
reaches the client as a cut body, and the upstream's record of the usage it served is the
usage the clients read.

Streams that must arrive in pieces go in lockstep with the client (`x-test-lockstep`: the
upstream writes an event only once the client has the one before), so no test relies on
timing for how Envoy cuts a body."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testbed.client import stream
from testbed.llm_answers import DEPTH, HUGE, PIECE, Tokens, garbage, usage
from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule
from testbed.stack import envoy_config

# A rule that covers no request of these tests: the filter lets each through unchecked.
UNMATCHED = plugin(rule("per-user", ["user"], 5, match={"path_prefix": "/unmatched/"}))
STREAM = {"model": "test-model", "stream": True, "stream_options": {"include_usage": True},
          "messages": [{"role": "user", "content": "hello"}]}
CHAT = {**STREAM, "stream": False}


@pytest.fixture
def upstream():
    with LlmUpstream() as server:
        yield server


@pytest.fixture
def gateway(stack_of, upstream):
    return stack_of(UNMATCHED, upstream=upstream.port)


def sent_usage(response):
    """The usage object the client read: a JSON body's, or a stream's `"choices": []` event's."""
    if "text/event-stream" not in response.headers["content-type"]:
        return json.loads(response.body).get("usage")
    chunks = [json.loads(e) for e in response.events() if e != b"[DONE]"]
    return next((c["usage"] for c in chunks if c["choices"] == []), None)


def in_lockstep(upstream, name):
    """An `on_chunk` for a stream sent with `x-test-lockstep: name`: each chunk that
    arrives lets the upstream write the next event."""
    return lambda index, data: upstream.release(name)


def test_the_stack_routes_to_the_upstream_only_when_given_one():
    plain = envoy_config(UNMATCHED, 1, 2, 3)
    routed = envoy_config(UNMATCHED, 1, 2, 3, upstream=4321)

    def route(config):
        return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]

    assert route(plain)["name"] == route(routed)["name"] == "upstream"
    assert "direct_response" in route(plain) and "route" not in route(plain)
    assert route(routed)["route"]["cluster"] == "upstream"
    assert [c["name"] for c in plain["static_resources"]["clusters"]] == ["ratelimit_bridge"]
    cluster = routed["static_resources"]["clusters"][-1]
    assert cluster["name"] == "upstream"
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 4321}
    # Nothing else changes.
    routed["static_resources"]["clusters"].pop()
    route(routed).pop("route")
    route(routed)["direct_response"] = route(plain)["direct_response"]
    assert routed == plain


def test_a_json_completion_arrives_whole_with_the_usage_chosen(gateway, upstream):
    chosen = {"x-test-prompt-tokens": "12", "x-test-completion-tokens": "34",
              "x-test-cached-tokens": "5", "x-test-reasoning-tokens": "7",
              "x-test-usage-header": "1"}
    response = gateway.stream(0, "/v1/chat/completions", CHAT, chosen)
    assert (response.status, response.complete, response.error) == (200, True, None)
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-usage-tokens"] == "46"
    body = json.loads(response.body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"] == usage(Tokens(12, 34, 5, 7)) == {
        "prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46,
        "prompt_tokens_details": {"cached_tokens": 5},
        "completion_tokens_details": {"reasoning_tokens": 7}}
    [served] = upstream.served
    assert (served.path, served.stream, served.tokens, served.usage_sent) == \
        ("/v1/chat/completions", False, Tokens(12, 34, 5, 7), True)


def test_a_stream_arrives_through_envoy_one_event_per_chunk_before_it_ends(gateway, upstream):
    seen = []

    def on_chunk(index, data):
        # The upstream has not finished (it records a stream after its [DONE]) while the
        # client reads.
        seen.append((data, len(upstream.served)))
        upstream.release("one-by-one")

    response = gateway.stream(0, "/v1/chat/completions", STREAM, {
        "x-test-chunks": "4", "x-test-prompt-tokens": "3", "x-test-completion-tokens": "4",
        "x-test-lockstep": "one-by-one"}, on_chunk=on_chunk, timeout=10)
    assert (response.status, response.complete, response.error) == (200, True, None)
    assert response.headers["content-type"] == "text/event-stream"
    # 4 content events, the usage event, [DONE]: each its own chunk, as the upstream wrote it.
    assert response.chunks == 6
    assert all(data.startswith(b"data: ") and data.endswith(b"\n\n") and data.count(b"data:") == 1
               for data, _ in seen)
    assert [records for _, records in seen[:5]] == [0] * 5
    events = response.events()
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["usage"] for c in chunks[:4]] == [None] * 4
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks[:4]) == \
        "tok0 tok1 tok2 tok3 "
    assert chunks[4]["choices"] == [] and chunks[4]["usage"] == usage(Tokens(3, 4))
    [served] = upstream.served
    assert (served.stream, served.events, served.usage_sent, served.total) == (True, 6, True, 7)


def test_a_slow_stream_passes_the_gateway(gateway, upstream):
    start = time.monotonic()
    response = gateway.stream(0, "/v1/chat/completions", STREAM,
                              {"x-test-chunks": "5", "x-test-chunk-delay-ms": "40"})
    assert time.monotonic() - start >= 6 * 0.040  # a pause before each event but the first
    assert (response.status, response.complete) == (200, True)
    assert len(response.events()) == 7 and sent_usage(response) == usage(Tokens(10, 20))


def test_an_upstream_reset_reaches_the_client_as_a_cut_body(gateway, upstream):
    response = gateway.stream(0, "/v1/chat/completions", STREAM, {
        "x-test-abort-after": "3", "x-test-lockstep": "cut"},
        on_chunk=in_lockstep(upstream, "cut"), timeout=10)
    assert response.status == 200
    assert not response.complete and response.error
    assert len(response.events()) == 3 and b"[DONE]" not in response.events()
    assert sent_usage(response) is None
    # A JSON body cut halfway: fewer bytes than its Content-Length.
    cut = gateway.stream(0, "/v1/chat/completions", CHAT, {"x-test-abort-after": "0"})
    assert cut.status == 200 and not cut.complete
    assert 0 < cut.size < int(cut.headers["content-length"])
    assert [(s.stream, s.events, s.usage_sent) for s in upstream.served] == \
        [(True, 3, False), (False, 0, False)]
    assert upstream.tokens_served() == 0


def test_the_usage_recorded_is_the_usage_two_hundred_parallel_clients_read(gateway, upstream):
    n = 200

    def kind(i):
        return "aborted" if i % 10 == 0 else "json" if i % 7 == 0 else "held"

    held = [i for i in range(n) if kind(i) == "held"]
    started = []
    lock = threading.Lock()

    def first_chunk(index, data):
        # Every held stream waits before its usage event until all of them have begun:
        # the upstream and the gateway carry them all at once.
        if index == 0:
            with lock:
                started.append(1)
                if len(started) == len(held):
                    upstream.release("all", len(held))

    def client(i):
        headers = {"x-request-n": str(i), "x-test-prompt-tokens": str(i),
                   "x-test-completion-tokens": str(2 * i + 1), "x-test-cached-tokens": str(i // 2)}
        on_chunk = None
        if kind(i) == "aborted":
            # In lockstep, so that the events before the reset reach the client first.
            headers.update({"x-test-abort-after": "2", "x-test-lockstep": f"cut-{i}"})
            on_chunk = in_lockstep(upstream, f"cut-{i}")
        if kind(i) == "held":
            headers["x-test-hold"] = "all"
            on_chunk = first_chunk
        return gateway.stream(0, "/v1/chat/completions", CHAT if kind(i) == "json" else STREAM,
                              headers, on_chunk=on_chunk, timeout=20)

    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(client, range(n)))
    assert len(started) == len(held)
    assert all(r.status == 200 for r in responses)
    assert [r.complete for r in responses] == [kind(i) != "aborted" for i in range(n)]
    records = {int(s.headers["x-request-n"]): s for s in upstream.wait_served(n)}
    assert sorted(records) == list(range(n))
    read = 0
    for i, response in enumerate(responses):
        got = sent_usage(response)
        served = records[i]
        assert served.tokens == Tokens(i, 2 * i + 1, i // 2)
        assert served.usage_sent == (got is not None) == (kind(i) != "aborted")
        if got is not None:
            assert got == usage(served.tokens)
            read += got["total_tokens"]
    assert read == upstream.tokens_served() == sum(
        3 * i + 1 for i in range(n) if kind(i) != "aborted")


def test_hostile_answers_pass_the_gateway_as_the_upstream_wrote_them(gateway, upstream):
    def get(body, kind, **headers):
        return gateway.stream(0, "/v1/chat/completions", body, {"x-test-body": kind, **headers},
                              keep=64 << 20)

    for body in (CHAT, STREAM):
        assert sent_usage(get(body, "huge-number"))["completion_tokens"] == HUGE
        assert sent_usage(get(body, "negative"))["prompt_tokens"] == -10
        assert sent_usage(get(body, "string"))["prompt_tokens"] == "10"
        assert sent_usage(get(body, "no-usage")) is None
        deep = get(body, "deep").body
        assert b'"usage": ' + b"[" * DEPTH + b'{"prompt_tokens": 10' in deep
        assert b"}" + b"]" * DEPTH + b"}" in deep
    assert get(CHAT, "garbage", **{"x-test-bytes": "5000"}).body == garbage(5000)
    assert garbage(5000) in get(STREAM, "garbage", **{"x-test-bytes": "5000"}).body
    cut = get(CHAT, "truncated").body
    with pytest.raises(ValueError):
        json.loads(cut)
    assert b'"usage": {"prompt_tokens": 10' in cut and cut.count(b"{") > cut.count(b"}")
    events = get(STREAM, "truncated").events()
    assert events[-1] == b"[DONE]" and b'"usage": {"prompt' in events[-2]
    with pytest.raises(ValueError):
        json.loads(events[-2])
    big = get(CHAT, "gigabyte", **{"x-test-bytes": str(4 << 20)})
    assert big.complete and len(json.loads(big.body)["choices"][0]["message"]["content"]) == \
        (4 << 20) // PIECE * PIECE
    big = get(STREAM, "gigabyte", **{"x-test-bytes": str(4 << 20)})
    assert big.complete and big.size > 4 << 20 and sent_usage(big) == usage(Tokens(10, 20))
    assert get(CHAT, "misspelt").status == 400
    # A gibibyte the client leaves early: the stream ends when the gateway drops it.
    before = len(upstream.served)
    left = gateway.stream(0, "/v1/chat/completions", STREAM, {"x-test-body": "gigabyte"},
                          on_chunk=lambda index, data: index < 16, keep=0)
    assert left.stopped and left.size < 1 << 30
    served = upstream.wait_served(before + 1)[-1]
    assert served.body == "gigabyte" and not served.usage_sent and served.events < 65536


def test_stopping_the_upstream_ends_the_streams_it_holds():
    upstream = LlmUpstream().start()
    try:
        response = stream(upstream.port, "/v1/chat/completions", STREAM,
                          {"x-test-hold": "never"}, on_chunk=lambda *_: upstream.stop(),
                          timeout=10)
    finally:
        upstream.stop()
    assert (response.status, response.complete) == (200, False)
    assert b"[DONE]" not in response.events() and sent_usage(response) is None
    [served] = upstream.wait_served(1)
    assert not served.usage_sent and served.events <= 5
