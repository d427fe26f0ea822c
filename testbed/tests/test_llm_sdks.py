"""The official `openai`, `anthropic` and `google-genai` Python SDKs through real Envoy
with the filter, as an LLM platform's users call it: each API's usage format
(docs/configuration.md#usage-formats) settles exactly the usage the SDK itself reports,
streamed and not, on Chat Completions, Responses, Messages and Gemini's generateContent;
over the limit, each SDK raises its rate-limit error and reads `Retry-After`. The upstream
is testbed/llm_upstream.py, in each API's shapes."""

import gzip

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from testbed.client import request
from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin, rule
from testbed.tests.test_metered import spent, wait_settled

BURST = 1_000_000
TENANT = {"x-tenant": "t1"}
USAGE = {"x-test-prompt-tokens": "40", "x-test-completion-tokens": "17",
         "x-test-cached-tokens": "15", "x-test-reasoning-tokens": "6"}
HI = [{"role": "user", "content": "hi"}]


def metered(name, prefix, usage, weights, requests=BURST):
    return rule(name, ["tenant"], requests, per="30d", match={"path_prefix": prefix},
                meter={"usage": usage, "weights": weights, "reserve": 100})


def config(requests=BURST):
    return plugin(
        metered("chat", "/v1/chat/", "openai-chat", {"output": 4, "cached_input": 0},
                requests),
        metered("responses", "/v1/responses", "openai-responses",
                {"output": 4, "reasoning": 8, "cached_input": 0}, requests),
        metered("messages", "/v1/messages", "anthropic", {"output": 5, "cached_input": 0},
                requests),
        metered("gemini", "/v1beta/models/", "gemini",
                {"output": 4, "reasoning": 8, "cached_input": 0}, requests),
        identity={"tenant": {"header": "x-tenant"}})


@pytest.fixture
def clients(stack_of):
    """(stack, an OpenAI client, an Anthropic client, a Gemini client), through gateway 0,
    retries off."""
    def make(plugin_):
        upstream = LlmUpstream().start()
        made.append(upstream)
        stack = stack_of(plugin_, gateways=1, upstream=upstream.port)
        base = f"http://127.0.0.1:{stack.ports[0]}"
        gemini = genai.Client(api_key="k", http_options=types.HttpOptions(
            base_url=base, api_version="v1beta", headers={**TENANT, **USAGE},
            retry_options=types.HttpRetryOptions(attempts=1)))
        return (stack, openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0),
                anthropic.Anthropic(base_url=base, api_key="k", max_retries=0), gemini)

    made = []
    yield make
    for upstream in made:
        upstream.stop()


def chat_cost(u):
    return (u.prompt_tokens - u.prompt_tokens_details.cached_tokens) + 4 * u.completion_tokens


def responses_cost(u):
    reasoning = u.output_tokens_details.reasoning_tokens
    return (u.input_tokens - u.input_tokens_details.cached_tokens
            + 4 * (u.output_tokens - reasoning) + 8 * reasoning)


def messages_cost(u):
    return u.input_tokens + u.cache_creation_input_tokens + 5 * u.output_tokens


def gemini_cost(u):
    return (u.prompt_token_count - u.cached_content_token_count
            + (u.tool_use_prompt_token_count or 0) + 4 * u.candidates_token_count
            + 8 * u.thoughts_token_count)


def test_each_sdk_is_charged_exactly_the_usage_it_reports(clients):
    stack, oa, an, gm = clients(config())
    headers = {**TENANT, **USAGE}
    costs = {"chat": 0, "responses": 0, "messages": 0, "gemini": 0}

    r = oa.chat.completions.create(model="m", messages=HI, extra_headers=headers)
    costs["chat"] += chat_cost(r.usage)
    chunks = oa.chat.completions.create(model="m", messages=HI, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_headers=headers)
    (usage,) = [c.usage for c in chunks if c.usage]
    costs["chat"] += chat_cost(usage)

    r = oa.responses.create(model="m", input="hi", extra_headers=headers)
    costs["responses"] += responses_cost(r.usage)
    events = oa.responses.create(model="m", input="hi", stream=True, extra_headers=headers)
    (usage,) = [e.response.usage for e in events if e.type == "response.completed"]
    costs["responses"] += responses_cost(usage)

    m = an.messages.create(model="m", max_tokens=100, messages=HI, extra_headers=headers)
    costs["messages"] += messages_cost(m.usage)
    with an.messages.stream(model="m", max_tokens=100, messages=HI,
                            extra_headers=headers) as stream:
        costs["messages"] += messages_cost(stream.get_final_message().usage)

    r = gm.models.generate_content(model="gemini-2.5-flash", contents="hi")
    costs["gemini"] += gemini_cost(r.usage_metadata)
    *_, last = gm.models.generate_content_stream(model="gemini-2.5-flash", contents="hi")
    costs["gemini"] += gemini_cost(last.usage_metadata)

    wait_settled(stack, 8)
    for name, cost in costs.items():
        assert cost > 0
        got = spent(stack, "t1", BURST, rule=name)
        assert abs(got - cost) < 1, (name, got, cost)
    assert stack.stats(0).get("unmeasured", 0) == 0


def test_over_the_limit_each_sdk_raises_its_rate_limit_error_with_retry_after(clients):
    # A reservation of 100 of 150: the second request in a month finds too few tokens.
    stack, oa, an, gm = clients(config(requests=150))
    headers = {**TENANT, **USAGE}
    oa.chat.completions.create(model="m", messages=HI, extra_headers=headers)
    with pytest.raises(openai.RateLimitError) as refused:
        oa.chat.completions.create(model="m", messages=HI, extra_headers=headers)
    assert int(refused.value.response.headers["retry-after"]) > 0
    an.messages.create(model="m", max_tokens=100, messages=HI, extra_headers=headers)
    with pytest.raises(anthropic.RateLimitError) as refused:
        an.messages.create(model="m", max_tokens=100, messages=HI, extra_headers=headers)
    assert int(refused.value.response.headers["retry-after"]) > 0
    gm.models.generate_content(model="gemini-2.5-flash", contents="hi")
    with pytest.raises(genai.errors.ClientError) as refused:
        gm.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert refused.value.code == 429


def test_a_per_model_rule_keeps_each_model_s_budget_and_its_tier(clients):
    """A token budget per tenant and model, the model read from the request's JSON body
    (`{"body": "model"}`), gpt-4o on a tier of its own: gpt-4o's budget spent, the SDK's
    gpt-4o-mini calls go on, each settled exactly in its own bucket."""
    per_model = rule("per-model", ["tenant", "model"], BURST, per="30d",
                     match={"path": "/v1/chat/completions"},
                     meter={"usage": "openai-chat", "weights": {"output": 4, "cached_input": 0},
                            "reserve": {"body": ["max_completion_tokens"], "default": 100,
                                        "max": 140}},
                     tier_identity="model", tiers={"gpt-4o": {"requests": 150, "per": "30d"}})
    stack, oa, _, _ = clients(plugin(per_model, identity={
        "tenant": {"header": "x-tenant"}, "model": {"body": "model", "trusted": True}}))
    headers = {**TENANT, **USAGE}
    dear = oa.chat.completions.create(model="gpt-4o", messages=HI, extra_headers=headers)
    # 150 - 104 left: too few for the 100 the next one reserves.
    with pytest.raises(openai.RateLimitError) as refused:
        oa.chat.completions.create(model="gpt-4o", messages=HI, extra_headers=headers)
    assert int(refused.value.response.headers["retry-after"]) > 0
    cheap = 0
    for _ in range(2):
        r = oa.chat.completions.create(model="gpt-4o-mini", messages=HI, extra_headers=headers,
                                       max_completion_tokens=120)
        cheap += chat_cost(r.usage)
    chunks = oa.chat.completions.create(model="gpt-4o-mini", messages=HI, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_headers=headers)
    (usage,) = [c.usage for c in chunks if c.usage]
    cheap += chat_cost(usage)
    wait_settled(stack, 4)
    assert abs(spent(stack, "t1:gpt-4o", 150, rule="per-model") - chat_cost(dear.usage)) < 1
    assert abs(spent(stack, "t1:gpt-4o-mini", BURST, rule="per-model") - cheap) < 1
    assert stack.stats(0).get("unmeasured", 0) == 0


def test_a_model_the_upstream_may_read_otherwise_fails_only_its_own_request(clients):
    """Hostile bodies on a rule keyed on the body's model, in real Envoy: the key twice,
    NaN (Python's json takes it), a value after the object (Go's Decoder stops before it), a
    number, gzip, a byte order mark or UTF-16 (Python's `json.loads` reads both), the key in
    another letter case, alone or after the real one (Go's `encoding/json` takes it, the
    last winning): each refused with 400 and a reason, never let through unlimited; a body
    with no model lacks the identity (here denied: `"missing": "deny"`); then an honest
    request still passes, its model counted."""
    per_model = rule("per-model", ["tenant", "model"], BURST, per="30d",
                     match={"path": "/v1/chat/completions"})
    stack, oa, _, _ = clients(plugin(per_model, identity={
        "tenant": {"header": "x-tenant"}, "model": {"body": "model", "missing": "deny"}}))
    port = stack.ports[0]
    json_ = {**TENANT, "content-type": "application/json"}
    for body, headers, reason in [
        (b'{"model": "gpt-4o-mini", "model": "gpt-4o"}', json_, "appears more than once"),
        (b'{"model": "gpt-4o", "temperature": NaN}', json_, "cannot be read"),
        (b'{"model": "gpt-4o"} {"model": "x"}', json_, "cannot be read"),
        (b'{"model": 4}', json_, "something other than a string"),
        (gzip.compress(b'{"model": "gpt-4o"}'), {**json_, "content-encoding": "gzip"},
         "compressed"),
        (b'\xef\xbb\xbf{"model": "gpt-4o"}', json_, "byte order mark"),
        ('{"model": "gpt-4o"}'.encode("utf-16"), json_, "byte order mark"),
        (b'{"Model": "gpt-4o"}', json_, "another letter case"),
        (b'{"model": "gpt-3.5", "MODEL": "gpt-4o"}', json_, "another letter case"),
    ]:
        status, _, text = request(port, "/v1/chat/completions", headers, method="POST",
                                  body=body)
        assert status == 400 and reason in text, (body, status, text)
    status, _, text = request(port, "/v1/chat/completions", json_, method="POST",
                              body=b'{"messages": []}')
    assert status == 429 and 'field \\"model\\" of its JSON body' in text, text
    oa.chat.completions.create(model="gpt-4o", messages=HI, extra_headers={**TENANT, **USAGE})
    assert stack.redis("EXISTS", "rl:per-model:t1:gpt-4o") == 1
    assert stack.stats(0)["rejected"] == 9


@pytest.mark.parametrize("include_usage", [True, False])
def test_include_usage_makes_an_openai_stream_that_did_not_ask_settle_exactly(clients,
                                                                              include_usage):
    """The SDK streams a chat completion without `stream_options` (most clients do): with
    `meter.include_usage` the filter adds the ask to the body it holds, the upstream
    streams its usage in one more chunk, which the SDK passes on as a chunk with no
    choices, and the rule is charged exactly that usage. Without it (the control), the
    stream reports nothing and is charged the meter's `max`."""
    chat = rule("chat", ["tenant"], BURST, per="30d", match={"path_prefix": "/v1/chat/"},
                meter={"usage": "openai-chat", "weights": {"output": 4, "cached_input": 0},
                       "include_usage": include_usage,
                       "reserve": {"header": "x-max", "default": 100, "max": 5000}})
    stack, oa, _, _ = clients(plugin(chat, identity={"tenant": {"header": "x-tenant"}}))
    chunks = list(oa.chat.completions.create(model="m", messages=HI, stream=True,
                                             extra_headers={**TENANT, **USAGE}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, "the completion streamed"
    usages = [c.usage for c in chunks if c.usage]
    wait_settled(stack, 1)
    if include_usage:
        (usage,) = usages
        assert [c.choices for c in chunks if c.usage] == [[]], "the usage chunk as sent"
        assert abs(spent(stack, "t1", BURST, rule="chat") - chat_cost(usage)) < 1
        assert stack.stats(0).get("unmeasured", 0) == 0
    else:
        assert usages == []
        assert abs(spent(stack, "t1", BURST, rule="chat") - 5000) < 1
        assert stack.stats(0)["unmeasured"] == 1
