"""Hot keys end to end, two gateways: the deny cache answers a client that is over its
limit without asking the bridge, exactly until its bucket could admit again."""

import json
import time

from testbed.plugins import plugin, rule


def test_a_denied_client_is_answered_locally_until_its_bucket_refills(stack_of):
    # One token every 4 s: a client denied now cannot be admitted for up to 4 s.
    stack = stack_of(plugin(rule("per-user", ["user"], 1, per="4s")), gateways=2)
    alice = {"x-user-id": "alice"}
    first = time.monotonic()
    assert stack.get(0, "/api/x", alice)[0] == 200
    status, headers, _ = stack.get(0, "/api/x", alice)
    assert status == 429
    sent = [stack.stats(g)["checks_sent"] for g in (0, 1)]
    assert sent[0] == 2

    for gateway in (0, 1, 0, 1, 0, 1):
        status, cached, body = stack.get(gateway, "/api/x", alice)
        assert status == 429, body
        assert cached["x-ratelimit-remaining"] == "0"
        assert cached["x-ratelimit-limit"] == "1"
        assert 1 <= int(cached["retry-after"]) <= 4
        assert abs(int(cached["x-ratelimit-reset"]) - int(headers["x-ratelimit-reset"])) <= 1
    stats = [stack.stats(g) for g in (0, 1)]
    # Gateway 0 knew at once; gateway 1 asked once, then knew too.
    assert stats[0]["checks_sent"] == sent[0]
    assert stats[1]["checks_sent"] == sent[1] + 1
    assert stats[0]["denied_cached"] == 3
    assert stats[1]["denied_cached"] == 2
    assert stats[1]["denied"] == 1

    # Bob is another bucket: asked and admitted.
    assert stack.get(0, "/api/x", {"x-user-id": "bob"})[0] == 200

    # Past the refill, exactly one more request is admitted, on either gateway.
    time.sleep(max(0.0, first + 4.5 - time.monotonic()))
    got = [stack.get(g, "/api/x", alice)[0] for g in (1, 0, 1)]
    assert sorted(got) == [200, 429, 429], got


def test_repeat_offenders_are_blocked_on_every_gateway_until_the_block_ends(stack_of):
    # 2 requests an hour; 3 denials within a minute block the client for 3 s.
    block = {"after": 3, "within": "1m", "for": "3s", "status": 403}
    stack = stack_of(plugin(rule("login", ["user"], 2, block=block)), gateways=2)
    mallory, alice = {"x-user-id": "mallory"}, {"x-user-id": "alice"}
    assert [stack.get(0, "/login", mallory)[0] for _ in range(2)] == [200, 200]
    # Two denials on gateway A (each asks the bridge: a rule that blocks counts every
    # denial in Redis), the third on gateway B.
    assert stack.get(0, "/login", mallory)[0] == 429
    assert stack.get(0, "/login", mallory)[0] == 429
    status, headers, body = stack.get(1, "/login", mallory)
    blocked_at = time.monotonic()
    assert status == 403, body
    assert json.loads(body)["error"] == "Blocked"
    assert 2 <= int(headers["retry-after"]) <= 3
    assert headers["x-ratelimit-remaining"] == "0"
    # Blocked on gateway A too, on its next request, which its cache did not know of.
    status, _, body = stack.get(0, "/login", mallory)
    assert status == 403 and "blocked" in body
    # Alice is unaffected.
    assert stack.get(0, "/login", alice)[0] == 200
    assert stack.get(1, "/login", alice)[0] == 200
    stats = [stack.stats(g) for g in (0, 1)]
    assert stats[0]["blocked"] + stats[1]["blocked"] == 2

    # The block ends on time: then the bucket decides again (still empty for an hour).
    time.sleep(max(0.0, blocked_at + 3.3 - time.monotonic()))
    status, _, body = stack.get(1, "/login", mallory)
    assert status == 429, body
    assert json.loads(body)["error"] == "Rate limit exceeded"
