"""Hot keys end to end, two gateways: the deny cache answers a client that is over its
limit without asking the bridge, exactly until its bucket could admit again."""

import json
import threading
import time

from testbed.plugins import plugin, rule
from testbed.stack import bucket_units, wait_for


def test_a_denied_client_is_answered_locally_until_its_bucket_refills(stack_of):
    # One token every 4 s: a client denied now cannot be admitted for up to 4 s.
    stack = stack_of(plugin(rule("per-user", ["user"], 1, per="4s")), gateways=2)
    alice = {"x-user-id": "alice"}
    assert stack.get(0, "/api/x", alice)[0] == 200
    status, headers, _ = stack.get(0, "/api/x", alice)
    # The token comes back before `denied + 4` (Redis took it before), and no gateway's
    # cache denies past that (its deadline counts from when it asked).
    denied = time.monotonic()
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

    # Past the refill, exactly one more request is admitted, on either gateway (the bucket
    # holds one token however late this is).
    time.sleep(max(0.0, denied + 4.5 - time.monotonic()))
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


def test_a_hot_key_at_twice_its_limit_stays_within_the_lease_bound(stack_of):
    # 100 a second, burst 100; each worker leases 5 tokens at a time, for 1 s. Two
    # gateways of one worker each send 100 requests a second each for 10 s: twice the rate.
    lease = {"tokens": 5, "ttl": "1s"}
    stack = stack_of(plugin(rule("global", [], 100, per="1s", lease=lease)), gateways=2)
    admitted, lock = [0], threading.Lock()
    start = time.monotonic() + 0.2
    duration, per_gateway_rate = 10.0, 100

    def load(gateway):
        sent = 0
        while True:
            due = start + sent / per_gateway_rate
            if due >= start + duration:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            if stack.get(gateway, "/hot")[0] == 200:
                with lock:
                    admitted[0] += 1
            sent += 1

    threads = [threading.Thread(target=load, args=(g,)) for g in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    burst_plus_rate = 100 + 100 * elapsed
    allowed = admitted[0]
    stats = [stack.stats(g) for g in (0, 1)]
    leased = sum(s["allowed_leased"] for s in stats)
    print(f"admitted {allowed} in {elapsed:.2f}s (burst + rate x t = {burst_plus_rate:.0f}), "
          f"{leased} from leases, {sum(s['denied_cached'] for s in stats)} denied from the "
          f"cache, {sum(s['checks_sent'] for s in stats)} checks sent")
    # At twice the rate the bucket is mostly empty: leases are granted while it has
    # tokens to spare (the burst), the deny cache answers the rest.
    assert leased > 0
    # Never above what the bucket allows (plus the refill of the last request's lag);
    # below it by at most the tokens two workers can hold in leases (2 x 5).
    assert allowed <= burst_plus_rate + 100 * 0.05
    assert allowed >= burst_plus_rate - 2 * 5 - 100 * 0.05
    assert abs(allowed - burst_plus_rate) <= 0.01 * burst_plus_rate


def test_a_lease_that_is_not_used_goes_back_to_the_bucket(stack_of):
    # 10 a minute: a token comes back every 6 s, so what the bucket holds is what was
    # returned. Leases of 5 tokens for 1 s.
    lease = {"tokens": 5, "ttl": "1s"}
    stack = stack_of(plugin(rule("global", [], 10, per="1m", lease=lease)), gateways=2)
    first = time.monotonic()
    assert stack.get(0, "/x")[1]["x-ratelimit-remaining"] == "9"
    # Seen again: takes 1 and leases 5 (the bucket shows what is left beyond them).
    assert stack.get(0, "/x")[1]["x-ratelimit-remaining"] == "3"
    # Gateway 1 sees the bucket as it is: 3 left, it takes 1.
    assert stack.get(1, "/x")[1]["x-ratelimit-remaining"] == "2"
    # The lease ends after its ttl; gateway 0 gives its 5 tokens back on its next tick.
    # Nothing else writes the bucket: Redis holds 2 (and a bit) until then, 7 after.
    den = 60_000 // 10  # units a token, at 10 a minute
    wait_for("the lease's 5 tokens back in the bucket",
             lambda: bucket_units(stack.redis_port, "rl:global") > 6 * den, timeout=20)
    left = int(stack.get(1, "/x")[1]["x-ratelimit-remaining"])
    # 7 less the one taken, and a token more for each 6 s since the first request.
    assert 6 <= left <= 6 + (time.monotonic() - first) // 6, left
    assert stack.stats(0)["allowed_leased"] == 0


def test_a_lease_running_low_is_topped_up_before_a_request_needs_a_check(stack_of):
    # Leases of 10: without top-ups every 11th request would find the lease empty and
    # check (2 + 3 checks for 40 requests). A lease below half its tokens asks for what
    # it lacks in the background, so the lease is topped up before it runs out.
    lease = {"tokens": 10, "ttl": "10s"}
    stack = stack_of(plugin(rule("global", [], 1000, lease=lease)))
    assert [stack.get(0, "/x")[0] for _ in range(40)] == [200] * 40
    stats = stack.stats(0)
    assert stats["allowed"] + stats["allowed_leased"] == 40, stats
    # The first check and the first ask, and at most two requests that beat a top-up.
    assert stats["allowed"] <= 4, stats
    # Every token is accounted for: what the bucket lacks is what was admitted or is held.
    held = 1000 - int(stack.get(0, "/x")[1]["x-ratelimit-remaining"]) - 41
    assert 0 <= held <= 10, held
