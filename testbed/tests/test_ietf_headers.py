"""The IETF draft-11 fields (`headers.ietf_draft`) as a client reads them, end to end:
`RateLimit-Policy` and `RateLimit` must parse as structured-field Lists of String Items with
the draft's parameters (http_sf, a strict RFC 9651 parser), and a refusal is an RFC 9457
problem of the draft's type whose effective window ends with `Retry-After`."""

import json

import http_sf

from testbed.plugins import plugin, rule


def sf_list(value):
    """The field as a List of (String, parameters); http_sf raises on any syntax error."""
    items = http_sf.parse(value.encode(), tltype="list")
    for name, _ in items:
        assert type(name) is str, f"{value!r}: the draft wants a String, not {type(name)}"
    return items


def test_the_draft_fields_parse_as_structured_lists_on_every_kind_of_reply(stack_of):
    every = rule("global", [], 100, per="1m")
    every["limit"]["burst"] = 200
    config = plugin(rule("per-user", ["user"], 3), every,
                    rule("trial", ["user"], 1, mode="shadow"), headers={"ietf_draft": True})
    stack = stack_of(config)
    alice = {"x-user-id": "alice"}

    for left in (2, 1, 0):
        status, headers, _ = stack.get(0, "/api/x", alice)
        assert status == 200
        policies = sf_list(headers["ratelimit-policy"])
        assert policies == [("per-user", {"q": 3, "w": 3600}),
                            ("global", {"q": 100, "w": 60, "burst": 200})], policies
        (shown,) = sf_list(headers["ratelimit"])
        assert shown[0] == "per-user" and shown[1]["r"] == left, shown
        assert 0 < shown[1]["t"] <= 3600

    # Refused twice: by the bridge's answer, then by the worker's deny cache.
    for _ in range(2):
        status, headers, body = stack.get(0, "/api/x", alice)
        assert status == 429
        assert len(sf_list(headers["ratelimit-policy"])) == 2
        ((name, params),) = sf_list(headers["ratelimit"])
        assert (name, params["r"]) == ("per-user", 0)
        assert params["t"] == int(headers["retry-after"]) > 0
        assert headers["content-type"] == "application/problem+json"
        problem = json.loads(body)
        assert problem["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
        assert problem["violated-policies"] == ["per-user"]
    assert stack.stats(0)["denied_cached"] == 1


def test_a_metered_rule_says_its_quota_counts_tokens(stack_of):
    """The draft registers no unit for an API's tokens: a metered rule's policy says so in
    a parameter of its own; a plain rule's says nothing (requests); X-RateLimit-* stay."""
    llm = rule("llm", ["user"], 5000, per="1m", meter={"header": "x-usage-tokens", "reserve": 10})
    config = plugin(llm, rule("per-user", ["user"], 3), headers={"ietf_draft": True})
    status, headers, _ = stack_of(config).get(0, "/api/x", {"x-user-id": "carol"})
    assert status == 200
    policies = dict(sf_list(headers["ratelimit-policy"]))
    assert policies["llm"] == {"q": 5000, "w": 60, "ratelimit-unit": "tokens"}, policies
    assert policies["per-user"] == {"q": 3, "w": 3600}, policies
    assert "x-ratelimit-limit" in headers


def test_a_blocked_client_gets_the_abnormal_usage_problem(stack_of):
    block = {"after": 1, "within": "1m", "for": "1m", "status": 403}
    config = plugin(rule("login", ["user"], 1, block=block), headers={"ietf_draft": True})
    stack = stack_of(config)
    bob = {"x-user-id": "bob"}
    assert stack.get(0, "/api/x", bob)[0] == 200
    # The first denial blocks; the second refusal comes from the worker's cache.
    for _ in range(2):
        status, headers, body = stack.get(0, "/api/x", bob)
        assert status == 403
        ((name, params),) = sf_list(headers["ratelimit"])
        assert name == "login" and params["r"] == 0
        assert params["t"] == int(headers["retry-after"]) > 50
        problem = json.loads(body)
        assert problem["type"].endswith("#abnormal-usage-detected"), problem
        assert problem["error"] == "Blocked"
