"""The checker of in-flight limits (docs/in-flight.md): every admission and every end of
a stream as its upstream saw them, and the bounds they must keep.

- **At most `max` in flight**: at no instant are more than `max` responses of one key in
  progress upstream. The upstream's interval of a request lies inside its slot's (the
  slot is taken before the request goes upstream and released after its stream ends), so
  counting the upstream's intervals can only undercount what the gateways held.
- **A dead gateway's slots come back within `ttl`**: a slot is renewed every third of its
  `ttl` while its request lives, so one whose gateway died at `K` expires between
  `K + ttl·2/3` and `K + ttl`; a gateway that denied a client meanwhile may refuse it for
  up to `DENY_CACHE_S` more from its deny cache."""

from dataclasses import dataclass

# A denied slot's wait, which a gateway's deny cache holds a denied client to.
DENY_CACHE_S = 1.0
# What a busy machine may add to the instants a test observes: the round trips of the
# renewals before the death and of the request that finds the slots free.
SLACK_S = 0.5


@dataclass(frozen=True)
class Verdict:
    """What the log shows: the most in flight at once, when, and what broke the bound."""

    most: int
    at: float
    violations: list


def judge(intervals, most_allowed):
    """Every admission and end (`intervals`: (start, end) pairs, monotonic seconds) against
    `most_allowed` in flight at once. Ends sort before starts at the same instant: a slot
    released and taken again at one instant never holds two requests."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    now = most = 0
    most_at = 0.0
    violations = []
    for at, step in events:
        now += step
        if now > most:
            most, most_at = now, at
        if now > most_allowed and step == 1:
            violations.append(f"{now} in flight at {at:.3f}, over {most_allowed}")
    return Verdict(most, most_at, violations)


def freed_in_time(killed_at, first_admitted_at, ttl_s):
    """Whether a dead gateway's slots came back as the bound says: not before the earliest
    expiry of a renewed slot, and no later than `ttl` past the death plus what a deny cache
    adds. Returns the reason it did not, or None."""
    if first_admitted_at is None:
        return f"never admitted again within {ttl_s + DENY_CACHE_S:.1f} s of the death"
    waited = first_admitted_at - killed_at
    if waited < ttl_s * 2 / 3 - SLACK_S:
        return f"admitted {waited:.2f} s after the death: a live slot expired early"
    if waited > ttl_s + DENY_CACHE_S + SLACK_S:
        return f"admitted {waited:.2f} s after the death, past ttl {ttl_s} s"
    return None
