"""The limiter on a replicated Valkey watched by Redis Sentinels (`--sentinel`): steady load
through a real Envoy while the primary is killed. Failures only inside the failover window,
everything served after it, exact limits on the promoted replica, and what a bucket that
straddles the failover admits (asynchronous replication may lose the last writes)."""

import re
import threading
import time
from datetime import datetime, timezone

import pytest

from testbed.plugins import IDENTITY, plugin, rule
from testbed.sentinel import SentinelGroup
from testbed.stack import Stack, request, wait_for

# The sentinels judge a master down after this. At 1 s a loaded 2-core machine sometimes
# kept the promoted replica from answering their pings for a second, and they failed over
# again (see the end of the test).
DOWN_AFTER_MS = 3000
# The failover must be over (the sentinels' down-after, their vote, the promotion, the
# bridge following) within this of the kill; measured here at about 5 s.
WINDOW_S = 15
STRADDLE_LIMIT = 600  # a day: refill over the test is far below one token
PROBE_LIMIT = 5
# The bridge's log line for each move of the master, with its time to the second.
MOVED = re.compile(r"^\[(\S+) WARN +ratelimit_bridge::store::connection::single\] redis master \"mymaster\" moved",
                   re.M)


@pytest.fixture
def group():
    group = SentinelGroup(replicas=2, down_after_ms=DOWN_AFTER_MS).start()
    yield group
    group.close()


class Load(threading.Thread):
    """Requests with `headers` (`{n}` in a value: the request's number, modulo 20), one
    after another with a pause of `gap_s`, each answer recorded with the time it came."""

    def __init__(self, stack, headers, gap_s):
        super().__init__(daemon=True)
        self.stack, self.headers, self.gap_s = stack, headers, gap_s
        self.answers = []
        self.wall = []  # each answer's wall-clock time, to compare with the bridge's log
        self.stopping = threading.Event()

    def run(self):
        n = 0
        while not self.stopping.is_set():
            headers = {name: value.format(n=n % 20) for name, value in self.headers.items()}
            status = self.stack.get(0, "/api/x", headers, timeout=10)[0]
            self.answers.append((time.monotonic(), status))
            self.wall.append(time.time())
            n += 1
            time.sleep(self.gap_s)

    def stop(self):
        self.stopping.set()
        self.join(timeout=30)


def test_the_limiter_follows_a_sentinel_failover_without_over_admitting_after_it(group):
    identity = {**IDENTITY, "tenant": {"header": "x-tenant"}}
    breaker = {"failures": 5, "open_ms": 100, "max_open_ms": 500}
    config = plugin(rule("steady", ["user"], 1_000_000),
                    rule("straddle", ["tenant"], STRADDLE_LIMIT, per="1d"),
                    rule("probe", ["api_key"], PROBE_LIMIT),
                    identity=identity, timeout_ms=500, circuit_breaker=breaker)
    stack = Stack(config, gateways=1, cluster=group)
    try:
        stack.start()
        old = group.primary
        steady = [Load(stack, {"x-user-id": f"user-{i}-{{n}}"}, 0.01) for i in range(2)]
        straddle = Load(stack, {"x-tenant": "acme"}, 0.02)
        for load in [*steady, straddle]:
            load.start()
        wait_for("steady answers", lambda: len(straddle.answers) >= 50)
        killed = time.monotonic()  # before the signal: a failure may come before kill() returns
        old.process.kill()  # SIGKILL: nothing saved, nothing said
        # Until the steady load has been answered 200 for 3 s after its last failure.
        while True:
            failures = [t for s in steady for t, status in s.answers if status != 200]
            if failures and time.monotonic() - max(failures) > 3:
                break
            assert time.monotonic() - killed < WINDOW_S + 10, "never served again"
            time.sleep(0.1)
        for load in [*steady, straddle]:
            load.stop()

        answers = [a for s in steady for a in s.answers]
        statuses = {status for _, status in answers}
        assert statuses <= {200, 503}, statuses  # 503: failure_mode closed, never a 429
        window = max(failures) - killed
        before = [t for t in failures if t < killed]
        after = [a for a in answers if a[0] > max(failures)]
        print(f"steady load: {len(answers)} answers, {len(failures)} failed, all within "
              f"{window:.1f}s of the kill; {len(after)} answered 200 after")
        assert not before, f"{len(before)} failures before the kill"
        assert window <= WINDOW_S, f"failures until {window:.1f}s after the kill"
        assert len(after) >= 50

        # The bridge follows the sentinels to the promoted replica.
        new = group.master()
        assert new is not old and new in group.replicas and new.role() == "master"
        # On a loaded machine the sentinels may fail over twice (the first promoted replica
        # judged down in turn): the bridge follows each move, from the old master to the last.
        log = stack.logs("bridge")
        assert f"moved: now 127.0.0.1:{new.port}, was " in log, log
        assert f", was 127.0.0.1:{old.port}" in log, log
        assert request(stack.bridge_port, "/healthz")[0] == 200
        metrics = request(stack.bridge_port, "/metrics")[2]
        assert f'node="127.0.0.1:{new.port}"' in metrics

        # A fresh bucket after the failover admits exactly its limit.
        probe = {"x-api-key": "fresh-after-failover"}
        got = [stack.get(0, "/api/x", probe)[0] for _ in range(PROBE_LIMIT + 3)]
        assert got == [200] * PROBE_LIMIT + [429] * 3, got

        # The bucket that straddles the failover: admitted before, during and after, then
        # drained. What it admits past its limit is what the promoted replica never got.
        admitted = sum(1 for _, status in straddle.answers if status == 200)
        taken_before = sum(1 for t, status in straddle.answers if status == 200 and t < killed)
        drained = 0
        while stack.get(0, "/api/x", {"x-tenant": "acme"})[0] == 200:
            drained += 1
            assert drained <= STRADDLE_LIMIT, "the straddling bucket never ran out"
        total = admitted + drained
        print(f"straddling bucket (limit {STRADDLE_LIMIT}): {taken_before} admitted before the "
              f"kill, {admitted - taken_before} during and after, {drained} to drain it: "
              f"{total} in all, {total - STRADDLE_LIMIT:+d} against the limit")
        # Over-admission is bounded by what the old master acknowledged and had not yet
        # replicated when it died; on loopback that is a few writes at most. When the
        # sentinels failed over twice, the replica promoted first went on taking writes as a
        # master after the second promotion, until they demoted it (the bridge followed them
        # within a second, as the log shows), and those writes are lost too: asynchronous
        # replication, not the limiter. Then the bound adds what the straddling load had
        # admitted from the first move to a second past the last (the log counts seconds).
        moves = [datetime.strptime(m, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                 .timestamp() for m in MOVED.findall(log)]
        interim = 0
        if len(moves) > 1:
            interim = sum(1 for (_, status), wall in zip(straddle.answers, straddle.wall)
                          if status == 200 and moves[0] <= wall < moves[-1] + 2)
            print(f"the sentinels failed over {len(moves)} times; {interim} admitted while an "
                  f"interim master was named")
        assert total - STRADDLE_LIMIT <= 5 + interim, total
    finally:
        stack.close()
