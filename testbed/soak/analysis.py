"""The verdict on a scenario's run: where each steady-load request falls against the fault
windows (outage, grace, steady) and whether its answer was allowed there, whether every
fault came back and every probe was exact, and whether memory stayed flat."""

from collections import Counter
from dataclasses import dataclass

from .memory import rss_flat, rss_trend
from .metering import Bound, judge
from .settings import (ALLOWED, EXPECTED_PROBE, GRACE_S, LLM_BURST, LLM_LEAST, LLM_MOST,
                       LLM_PARALLEL, LLM_PER_S, PROBE_BURST)

# The metering abuser's key, as the bound of docs/configuration.md sees it.
ABUSER_BOUND = Bound(LLM_BURST, LLM_BURST / LLM_PER_S, LLM_PARALLEL, LLM_MOST, LLM_LEAST)


def place(sent, done, windows):
    """("outage" | "grace" | "steady", index of the window or None) of a request in flight
    from `sent` to `done`: in a window if in flight at any moment of it, in its grace if
    at any moment of the GRACE_S after it ends."""
    for i, w in enumerate(windows):
        if sent <= w.end and done >= w.start:
            return "outage", i
    for i, w in enumerate(windows):
        if sent <= w.end + GRACE_S and done >= w.end:
            return "grace", i
    return "steady", None


@dataclass
class Analysis:
    zones: dict      # zone -> (Counter of statuses, [latencies])
    per_window: list  # window index -> Counter of statuses (window and its grace)
    checks: list     # [(what, ok, detail)]
    rss_rows: list


def analyse(result):
    zones = {z: (Counter(), []) for z in ALLOWED}
    per_window = [Counter() for _ in result.windows]
    for sent, latency, status, _ in result.requests:
        zone, index = place(sent, sent + latency, result.windows)
        zones[zone][0][status] += 1
        zones[zone][1].append(latency)
        if index is not None:
            per_window[index][status] += 1
    checks = [("steady load sent", sum(len(lat) for _, lat in zones.values()) > 0,
               f"{sum(len(lat) for _, lat in zones.values())} requests")]
    for zone, allowed in ALLOWED.items():
        statuses = zones[zone][0]
        bad = {s: n for s, n in statuses.items() if s not in allowed}
        checks.append((f"{zone}: answers are {' or '.join(map(str, sorted(allowed)))}", not bad,
                       f"{sum(bad.values())} of {sum(statuses.values())} otherwise"
                       + (f" ({describe(bad)})" if bad else "")))
    back = [w for w in result.windows if not w.failed]
    checks.append(("every fault: component back, limiting resumed", len(back) == len(result.windows),
                   f"{len(back)} of {len(result.windows)}"))
    probes = [result.baseline] + [w.probe for w in back]
    exact = sum(p == EXPECTED_PROBE for p in probes)
    checks.append((f"probes exact ({PROBE_BURST} x 200, then 429)", exact == len(probes),
                   f"{exact} of {len(probes)} (baseline and after each recovery)"))
    rss_rows, judged, flat = rss_table(result)
    checks.append(("memory flat", judged > 0 and flat == judged,
                   f"{flat} of {judged} processes judged flat"))
    if result.metering is not None:
        checks.append(metering_check(result))
    return Analysis(zones, per_window, checks, rss_rows)


def metering_check(result):
    """The metering abuser held to its bound in every epoch between Valkey restarts (each
    gives every key its burst again)."""
    resets = [w.start for w in result.windows if w.fault == "Valkey restart"]
    epochs = judge(result.metering, resets, result.t0, result.t1, ABUSER_BOUND)
    worst = max(epochs, key=lambda e: e.consumed - e.allowed)
    detail = (f"{len(result.metering)} responses served in {len(epochs)} epochs; the worst "
              f"consumed {worst.consumed} tokens of {worst.allowed:.0f} allowed in "
              f"{worst.end - worst.start:.0f} s")
    return ("metering abuser within B + r x t + N x (C - R)", all(e.held for e in epochs)
            and len(result.metering) > 0, detail)


def rss_table(result):
    """Rows of the memory table, and how many lifetimes were judged and found flat: the
    last lifetime of each process (the Envoys have one; a restarted process is judged on
    its last)."""
    last_pid = {}
    for (name, pid), samples in sorted(result.rss.items(), key=lambda kv: kv[1][0][0]):
        last_pid[name] = pid
    rows, judged, flat = [], 0, 0
    for (name, pid), samples in sorted(result.rss.items(), key=lambda kv: (kv[0][0], kv[1][0][0])):
        trend = rss_trend(samples)
        lived = samples[-1][0] - samples[0][0]
        first = last = growth = "-"
        if trend is not None:
            first, last = f"{trend[0] / 1024:.1f}", f"{trend[1] / 1024:.1f}"
            growth = f"{(trend[1] - trend[0]) / 1024:+.1f}"
        if last_pid[name] != pid:
            verdict = "restarted (not judged)"
        elif trend is None:
            verdict = "too short to judge"
        else:
            judged += 1
            ok = rss_flat(*trend)
            flat += ok
            verdict = "flat" if ok else "GROWING"
        rows.append((name, pid, f"{lived:.0f}", len(samples), first, last, growth, verdict))
    return rows, judged, flat


def describe(statuses):
    """{200: 3, 0: 1} -> "200: 3, no answer: 1"."""
    return ", ".join(f"{'no answer' if s == 0 else s}: {n}" for s, n in sorted(statuses.items()))
