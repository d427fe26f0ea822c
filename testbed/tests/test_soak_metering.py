"""The soak's metering abuser and its verdict (testbed/soak/metering.py), short: the
checker catches a log that breaks the bound (the fourth review's, before the fix: each
response paid its reservation) and passes one that keeps it; and the abuser, run for a few
seconds against real Envoy, the bridge and Valkey in front of the LLM upstream, is held to
the bound of docs/configuration.md."""

import time

from testbed.attacks import MeteringAbuser
from testbed.llm_upstream import LlmUpstream
from testbed.plugins import plugin
from testbed.soak.analysis import ABUSER_BOUND
from testbed.soak.metering import judge
from testbed.soak.settings import LLM_KEY, LLM_PATH, LLM_PREFIX, LLM_RULE, LLM_WEIGHTS


def test_the_checker_catches_a_client_paying_its_reservations_only():
    # Before the fix, a response the meter could not read paid its reservation (100): the
    # burst of 2,000 let 20 such responses of 600 through at once, 12,000 tokens.
    before_the_fix = [(t * 0.25, 600) for t in range(20)]
    [epoch] = judge(before_the_fix, [], 0.0, 60.0, ABUSER_BOUND)
    assert epoch.consumed == 12_000 and not epoch.held, epoch
    # What the bound allows: a burst's worth and 8 parallel overshoots, each epoch between
    # resets a window of its own.
    within = [(0.0, 1004)] * 8 + [(1.0, 600)] * 3
    [epoch] = judge(within, [], 0.0, 60.0, ABUSER_BOUND)
    assert epoch.held and epoch.consumed == 9_832
    two = judge(within + [(t + 30.0, c) for t, c in within], [30.0], 0.0, 60.0, ABUSER_BOUND)
    assert [e.held for e in two] == [True, True]
    assert not judge(within * 2, [30.0], 0.0, 60.0, ABUSER_BOUND)[0].held


def test_the_metering_abuser_is_held_to_its_bound(stack_of):
    with LlmUpstream() as upstream:
        rules = plugin(LLM_RULE, identity={"api_key": {"header": "x-api-key"}})
        stack = stack_of(rules, gateways=2, upstream=upstream.port, upstream_prefix=LLM_PREFIX)
        start = time.monotonic()
        abuser = MeteringAbuser(stack.ports, LLM_PATH, LLM_KEY).start()
        time.sleep(6)  # the attack's length: the bound is judged over whatever it sent
        abuser.stop()
        end = time.monotonic()
        served = [(s.at, LLM_WEIGHTS["prompt"] * s.tokens.prompt
                   + LLM_WEIGHTS["completion"] * s.tokens.completion) for s in upstream.served]
    [epoch] = judge(served, [], start, end, ABUSER_BOUND)
    assert epoch.held, (epoch, abuser.summary())
    # It got through at first, was charged at least what it consumed (the silent stream
    # its max), and refused from then on: every kind was tried.
    assert epoch.consumed >= 600, (epoch, abuser.summary())
    assert all(counts for counts in abuser.statuses.values()), abuser.summary()
    assert sum(c.get(429, 0) for c in abuser.statuses.values()) > 0, abuser.summary()
    # The routed prefix only: the stand-in still answers elsewhere.
    assert stack.get(0, "/elsewhere")[2] == "hello from the upstream\n"
