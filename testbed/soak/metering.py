"""The metering abuser's verdict (testbed/attacks.py `MeteringAbuser`): what the upstream
consumed for the abuser's key, epoch by epoch, against the bound docs/configuration.md
states for metered limits, `B + r x t + N x (C - R)` per window. An epoch ends where the
buckets were lost (a Valkey restarted empty gives every key its burst again), so each is
a window of its own. `judge` is pure: testbed/tests/test_soak_metering.py holds it to a
log that keeps the bound and to one that does not (the review's, before the fix)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """One key's bound: `burst` B, `rate_per_s` r, at most `parallel` N requests in flight,
    each consuming at most `most` C and reserving at least `least` R tokens."""
    burst: int
    rate_per_s: float
    parallel: int
    most: int
    least: int

    def allowed(self, seconds):
        return self.burst + self.rate_per_s * seconds + self.parallel * (self.most - self.least)


@dataclass(frozen=True)
class Epoch:
    start: float
    end: float
    responses: int
    consumed: int
    allowed: float

    @property
    def held(self):
        return self.consumed <= self.allowed


def judge(served, resets, start, end, bound):
    """The epochs of [`start`, `end`] split at `resets` (times the buckets were lost), each
    with the responses `served` ([(at, tokens consumed)]) whose requests came in it."""
    cuts = [start] + sorted(t for t in resets if start < t < end) + [end]
    epochs = []
    for a, b in zip(cuts, cuts[1:]):
        costs = [tokens for at, tokens in served if a <= at < b or (b == end and at == b)]
        epochs.append(Epoch(a, b, len(costs), sum(costs), bound.allowed(b - a)))
    return epochs
