"""testbed/SOAK.md: the Markdown report of a soak, from the runs and their analyses. What it
says about the method (the load, the probe, the windows, the memory check) is written
from the settings, so that it cannot drift from what ran."""

import itertools
import os
import subprocess
import time

from ..stack import ROOT
from .analysis import describe
from .settings import (BREAKER, GRACE_S, PATH, PLUGIN, PROBE_BURST, PROBE_EXTRA, RSS_SLACK_KIB,
                       RSS_TOLERANCE, SAMPLE_EVERY_S, USERS, WORKERS)


def runs(statuses):
    """[200, 200, 429] -> "200 x2, 429 x1"."""
    if not statuses:
        return "-"
    out = []
    for status, group in itertools.groupby(statuses):
        out.append(f"{status or 'no answer'} x{len(list(group))}")
    return ", ".join(out)


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(values, q):
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"


def scenario_section(result, analysis):
    t0 = result.t0
    fault_rows = []
    for i, w in enumerate(result.windows):
        fault_rows.append((
            i + 1, w.fault, f"{w.start - t0:.1f}", f"{w.end - w.start:.1f}",
            "-" if w.recovered is None else f"{w.recovered - w.end:.1f}",
            describe(analysis.per_window[i]) or "-", runs(w.probe), w.note))
    zone_rows = []
    for zone, (statuses, latencies) in analysis.zones.items():
        other = {s: n for s, n in statuses.items() if s not in (200, 429, 503)}
        zone_rows.append((zone, len(latencies), statuses[200], statuses[429], statuses[503],
                          describe(other) or "0", ms(latencies, 0.5), ms(latencies, 0.99),
                          ms(latencies, 1.0)))
    counters = "; ".join(
        f"gateway {g}: " + ", ".join(f"{k} {c[k]}" for k in
                                     ("allowed", "denied", "backend_failures", "short_circuits")
                                     if k in c)
        for g, c in enumerate(result.counters))
    return "\n\n".join([
        f"## {result.scenario.name}: {result.scenario.title}",
        f"{result.t1 - t0:.0f} s of load, {len(result.windows)} faults. Baseline probe before "
        f"any fault: {runs(result.baseline)}. The filter's counters: {counters}."
        + (f"\n\nAttacks, all along: {result.attacks}." if result.attacks else "")
        + (f"\n\nThe metering abuser (key `abuser` of the `llm` rule, 2,000 tokens an hour, "
           f"every way of paying less than it consumes, in turn), its answers: {result.abuser}."
           if result.abuser else ""),
        "### Faults\n\n" + table(
            ("#", "fault", "at s", "back after s", "limiting again after s",
             f"steady answers in window + {GRACE_S:.0f} s", "probe after", "what happened"),
            fault_rows),
        "### Steady-load answers\n\n" + table(
            ("where", "requests", "200", "429", "503", "other", "p50 ms", "p99 ms", "max ms"),
            zone_rows),
        "### Memory (VmRSS, MiB)\n\n" + table(
            ("process", "pid", "lived s", "samples", "first quarter", "last quarter", "growth",
             "verdict"), analysis.rss_rows),
    ])


def report(results, analyses, args, started, loads, elapsed):
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    check_rows = [(r.scenario.name, what, "ok" if ok else "FAIL", detail)
                  for r, a in zip(results, analyses) for what, ok, detail in a.checks]
    passed = all(row[2] == "ok" for row in check_rows)
    intro = (
        f"`python -m testbed.soak --minutes {args.minutes:g}` (`make soak SOAK_MINUTES={args.minutes:g}`), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, commit {commit or '?'}, "
        f"{os.cpu_count()} cores (load average {loads[0]:.1f} before, {loads[1]:.1f} after), "
        f"{elapsed / 60:.1f} minutes in all. **{'PASS' if passed else 'FAIL'}**.\n\n"
        f"Steady load: {args.rate:g} requests/s in all, open loop, over {WORKERS} keep-alive "
        f"connections, half to each gateway; {USERS} users on `per-user` (1000 per minute "
        f"each: never denied), `GET {PATH}`. After every recovery a fresh client of `probe` "
        f"(burst {PROBE_BURST} per hour) sends {PROBE_BURST + PROBE_EXTRA} requests one at a "
        "time, alternating between the gateways: exactly "
        f"{PROBE_BURST} must pass, then 429. Plugin: `failure_mode: closed`, "
        f"`timeout_ms: {PLUGIN['backend']['timeout_ms']}`, breaker {BREAKER['failures']} failures, "
        f"open {BREAKER['open_ms']} ms doubling to {BREAKER['max_open_ms']} ms.\n\n"
        "A request is *in a window* when it was in flight at any moment between a fault's "
        "injection and its component being back (Valkey answering PING, the bridge /healthz, "
        f"the cluster healthy with the killed node rejoined); *in the grace* when in flight "
        f"during the {GRACE_S:.0f} s after (the filter reopens its stream with a backoff of up "
        "to 5 s, the breaker stays open up to 2 s); *steady* otherwise. Steady answers must all "
        "be 200; in a window or its grace, 200 or 503 (`failure_mode: closed`), never anything "
        f"else. Memory: VmRSS every {SAMPLE_EVERY_S:.0f} s per process; past a warm-up (the "
        "first fifth of its samples) the median of the last quarter must be within "
        f"{RSS_TOLERANCE:.0%} or {RSS_SLACK_KIB // 1024} MiB of the first quarter's, judged "
        "on each process's last lifetime (a restarted bridge or Valkey is a new process).")
    sections = [f"# Soak and chaos report\n\n{intro}",
                "## Checks\n\n" + table(("scenario", "check", "result", "detail"), check_rows)]
    sections += [scenario_section(r, a) for r, a in zip(results, analyses)]
    return "\n\n".join(sections) + "\n", passed
