#!/usr/bin/env python3
"""`make soak`: the proof of robustness, which the unit and end-to-end tests cannot give in
seconds. Steady load runs through two Envoy gateways for many minutes while the backend is
broken on purpose, in two scenarios one after the other:

  single   one Valkey, one bridge: Valkey stopped and started again on its port; the
           bridge killed with SIGKILL and started again
  cluster  a Valkey Cluster of 3 primaries with a replica each, a bridge with --cluster:
           a primary killed with SIGKILL (its replica takes over, the old primary rejoins
           as the new one's replica); the bridge killed with SIGKILL and started again
  attacked the faults of `single`, while the security review's attacks run all along
           (testbed/attacks.py): every bridge connection slot held by unauthenticated
           peers that never read, 20 token-holding gRPC streams that never read their
           replies, and fresh clients filling a Valkey of `maxmemory` 2mb (volatile-ttl)
           with keys; the steady load is held to the same checks

and checks, from every request's send time, latency and status placed against the fault
windows:

  * outside the windows and their recovery grace (GRACE_S) every answer is 200; inside,
    200 or the 503 of `failure_mode: closed`, never anything else (no dropped connection);
  * limiting is exact after every recovery: a fresh client of the probe rule gets exactly
    its burst across both gateways, then 429;
  * resident memory (VmRSS) of each gateway, the bridge and Valkey stays flat: after a
    warm-up, the median of the last quarter of a process's samples is within
    RSS_TOLERANCE (or RSS_SLACK_KIB) of the first quarter's.

Prints the report and writes it to testbed/SOAK.md (--out); exits 1 when a check fails,
keeping the logs, the per-request records and the memory samples. The load comes from Python threads on
keep-alive connections rather than bench's loadgen, which keeps only a summary: the soak
needs each request's time and status. Every process is a stack.Process, stopped on
success, failure, Ctrl-C or SIGTERM.
"""

import argparse
import atexit
import csv
import http.client
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .attacks import Attacks
from .cluster import SLOTS, ValkeyCluster
from .stack import ROOT, Background, Stack, request, wait_for

# Steady load: bounded, loopback only. 1000 users at 300 requests/s is 0.3 per user and
# second, far under their 1000 per minute: the steady load is never denied.
RATE = 300.0
WORKERS = 16
USERS = 1000
PATH = "/api/soak"
REQUEST_TIMEOUT_S = 10.0
# The probe of exact limiting: a fresh client per probe, this burst per hour.
PROBE_BURST = 20
PROBE_EXTRA = 5
EXPECTED_PROBE = [200] * PROBE_BURST + [429] * PROBE_EXTRA

# Faults: about one every FAULT_SPACING_S, kinds alternating, never sooner than
# MIN_STEADY_S after limiting resumed from the previous one.
FAULT_SPACING_S = 30.0
MIN_STEADY_S = 3.0
VALKEY_DOWN_S = 3.0
BRIDGE_DOWN_S = 2.0
REJOIN_AFTER_S = 3.0  # a killed primary restarts this long after its replica took over
RECOVERY_TIMEOUT_S = 60.0
# After a component is back, answers may still be 503 for a while: the filter reopens its
# gRPC stream with a backoff that doubles up to 5 s, and the breaker (below) stays open up
# to 2 s. Past this grace, anything but 200 is a failure.
GRACE_S = 10.0

# Memory: sampled every SAMPLE_EVERY_S; the first fifth of a process's samples is its
# warm-up; judged when at least RSS_MIN_SAMPLES remain.
SAMPLE_EVERY_S = 2.0
RSS_TOLERANCE = 0.20
RSS_SLACK_KIB = 4096
RSS_MIN_SAMPLES = 8

BREAKER = {"failures": 5, "open_ms": 200, "max_open_ms": 2000}
PLUGIN = {
    # A generous timeout: the soak is about faults, not about latency on a shared machine.
    "backend": {"cluster": "ratelimit_bridge", "timeout_ms": 1000},
    "failure_mode": "closed",
    "circuit_breaker": BREAKER,
    "identity": {"user": {"header": "x-user-id"}, "probe": {"header": "x-probe-id"}},
    "rules": [
        {"name": "per-user", "key": ["user"], "limit": {"requests": 1000, "per": "1m"}},
        {"name": "probe", "key": ["probe"], "limit": {"requests": PROBE_BURST, "per": "1h"}},
    ],
}
# The attacked scenario: the gateways' token; the bridge's slots, all held by the attackers;
# fresh clients of their own rule (10 per hour: each key lives minutes), filling a Valkey
# whose maxmemory a few thousand of them exceed.
TOKEN = "soak-gateways-token"
ATTACK_SLOTS = 256
FRESH_RATE = 200.0
FRESH_PATH = "/api/fresh"
VALKEY_MEMORY = ["--maxmemory", "2mb", "--maxmemory-policy", "volatile-ttl"]


def attacked_plugin():
    plugin = {**PLUGIN, "backend": {**PLUGIN["backend"], "token": TOKEN},
              "identity": {**PLUGIN["identity"], "fresh": {"header": "x-fresh-id"}}}
    plugin["rules"] = PLUGIN["rules"] + [
        {"name": "fresh", "key": ["fresh"], "match": {"path": FRESH_PATH},
         "limit": {"requests": 10, "per": "1h"}}]
    return plugin


# What a steady-load request may be answered, by where it falls.
ALLOWED = {"outage": {200, 503}, "grace": {200, 503}, "steady": {200}}


def get_status(port, headers):
    """(status, X-RateLimit-Limit) of one request on its own connection; (0, None) when
    no answer came."""
    try:
        status, answer, _ = request(port, PATH, headers, timeout=REQUEST_TIMEOUT_S)
    except (OSError, http.client.HTTPException):
        return 0, None
    return status, answer.get("x-ratelimit-limit")


class Load:
    """Open-loop steady load: `rate` requests/s in all over `workers` threads, each on one
    keep-alive connection to one gateway (alternating); request n is user n % `users`.
    A worker that falls behind (slow answers) skips the missed slots instead of bursting
    to catch up, so the rate stays bounded. Keeps every request's send time (monotonic),
    latency and status (0: no answer)."""

    def __init__(self, ports, rate, users, workers):
        self.ports, self.users = ports, users
        self.interval = workers / rate
        self.counter = itertools.count()
        self.stopping = threading.Event()
        self.records = [(array("d"), array("d"), array("H")) for _ in range(workers)]
        self.threads = [threading.Thread(target=self.worker, args=(i, workers), daemon=True)
                        for i in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)

    def worker(self, i, workers):
        gateway = i % len(self.ports)
        sent, latency, status = self.records[i]
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[gateway], timeout=REQUEST_TIMEOUT_S)
        next_at = time.monotonic() + i * self.interval / workers
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now < next_at:
                    self.stopping.wait(next_at - now)
                    continue
                code = 0
                try:
                    conn.request("GET", PATH, headers={"x-user-id": f"user{next(self.counter) % self.users}"})
                    resp = conn.getresponse()
                    resp.read()
                    code = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()  # the next request connects again
                done = time.monotonic()
                sent.append(now)
                latency.append(done - now)
                status.append(code)
                next_at = max(next_at + self.interval, done)
        finally:
            conn.close()

    def requests(self):
        """[(sent, latency, status, gateway)] of every request, in no particular order."""
        return [(t, d, s, i % len(self.ports))
                for i, (sent, latency, status) in enumerate(self.records)
                for t, d, s in zip(sent, latency, status)]


def rss_kib(pid):
    """VmRSS of a live process in KiB, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class RssSampler(Background):
    """VmRSS of the run's processes every SAMPLE_EVERY_S, per process lifetime: a
    restarted bridge or Valkey is a new process, sampled apart. `processes()` gives the
    current [(name, stack.Process)]."""

    def __init__(self, processes):
        self.processes = processes
        self.samples = {}  # (name, pid) -> [(monotonic time, KiB)]
        super().__init__()

    def run(self):
        while True:
            now = time.monotonic()
            for name, process in self.processes():
                proc = process.proc
                kib = rss_kib(proc.pid) if proc is not None and proc.poll() is None else None
                if kib is not None:
                    self.samples.setdefault((name, proc.pid), []).append((now, kib))
            if self.stopping.wait(SAMPLE_EVERY_S):
                return


def rss_trend(samples):
    """(first-quarter median, last-quarter median) in KiB of one lifetime's samples past
    its warm-up, or None when too few remain to judge."""
    values = [kib for _, kib in samples]
    values = values[len(values) // 5:]
    if len(values) < RSS_MIN_SAMPLES:
        return None
    quarter = len(values) // 4
    return statistics.median(values[:quarter]), statistics.median(values[-quarter:])


def rss_flat(first, last):
    return last - first <= max(RSS_TOLERANCE * first, RSS_SLACK_KIB)


@dataclass
class Window:
    """One fault: from its injection (`start`) to the component being back (`end`), then
    to both gateways limiting again (`recovered`, None if they never did); the probe's
    statuses after it."""
    fault: str
    start: float
    end: float = None
    recovered: float = None
    probe: list = field(default_factory=list)
    note: str = ""
    failed: bool = False


# Faults: each breaks one component and returns when it is back, with a note for the report.

def restart_valkey(stack, _cluster, _occurrence):
    stack.valkey.stop()
    time.sleep(VALKEY_DOWN_S)
    stack.start_valkey()
    return f"stopped, started again on :{stack.redis_port} {VALKEY_DOWN_S:.0f} s later (empty)"


def kill_bridge(stack, _cluster, _occurrence):
    stack.bridge.kill()
    time.sleep(BRIDGE_DOWN_S)
    stack.start_bridge()
    return f"SIGKILL, started again {BRIDGE_DOWN_S:.0f} s later"


def fail_over_primary(_stack, cluster, occurrence):
    """Kills the primary of one slot range in turn; its replica takes over; the killed
    node restarts and rejoins as the new primary's replica (so the next failover of its
    range has a replica again)."""
    slot = (occurrence % len(cluster.primaries)) * (SLOTS // len(cluster.primaries))

    def owner():
        live = next(n for n in cluster.nodes if n.alive())
        port = cluster.slot_owners(live)[slot]
        return next(n for n in cluster.nodes if n.port == port)

    victim = owner()
    victim.process.kill()
    killed = time.monotonic()
    wait_for("a replica to take over", lambda: owner() is not victim and cluster.healthy(),
             timeout=RECOVERY_TIMEOUT_S)
    failover_s = time.monotonic() - killed
    successor = owner()
    time.sleep(REJOIN_AFTER_S)
    victim.restart()

    def rejoined():
        role = victim.cmd("ROLE")
        return role[0] in ("slave", "replica") and int(role[2]) == successor.port and role[3] == "connected"

    wait_for(f"{victim.process.name} to rejoin as a replica", rejoined, timeout=RECOVERY_TIMEOUT_S)
    wait_for("cluster state ok", cluster.healthy, timeout=RECOVERY_TIMEOUT_S)
    return (f"{victim.process.name} (:{victim.port}) SIGKILL; {successor.process.name} took over "
            f"in {failover_s:.1f} s; {victim.process.name} rejoined as its replica")


@dataclass
class Scenario:
    name: str
    title: str
    cluster: bool
    faults: list  # [(label, function)], injected in turn
    attacked: bool = False


SCENARIOS = [
    Scenario("single", "single Valkey, two gateways, one bridge", False,
             [("Valkey restart", restart_valkey), ("bridge kill -9", kill_bridge)]),
    Scenario("cluster", "Valkey Cluster (3 primaries, 1 replica each), two gateways, "
             "one bridge with --cluster", True,
             [("primary kill -9, failover", fail_over_primary), ("bridge kill -9", kill_bridge)]),
    Scenario("attacked", "single Valkey (maxmemory 2mb, volatile-ttl), two gateways, one "
             f"bridge with --token-file and --max-connections {ATTACK_SLOTS}, under attack", False,
             [("Valkey restart", restart_valkey), ("bridge kill -9", kill_bridge)], attacked=True),
]


def fault_times(duration):
    """Planned seconds of the faults: about one every FAULT_SPACING_S, at least two."""
    n = max(2, round(duration / FAULT_SPACING_S) - 1)
    return [duration * (k + 1) / (n + 1) for k in range(n)]


def wait_limiting(stack, tag):
    """When every gateway answers a fresh client with 200 and limit headers (bounded wait),
    as monotonic time; None if they never did."""
    headers = {"x-user-id": f"ready-{tag}"}

    def limiting():
        answers = [get_status(port, headers) for port in stack.ports]
        return all(status == 200 and limit is not None for status, limit in answers)

    try:
        wait_for("limiting to resume", limiting, timeout=RECOVERY_TIMEOUT_S)
    except RuntimeError:
        return None
    return time.monotonic()


def probe(stack, tag):
    """A fresh client of the probe rule sends PROBE_BURST + PROBE_EXTRA requests, one at a
    time, alternating between the gateways; returns the statuses."""
    headers = {"x-probe-id": f"probe-{tag}"}
    return [get_status(stack.ports[n % len(stack.ports)], headers)[0]
            for n in range(PROBE_BURST + PROBE_EXTRA)]


def sleep_until(at):
    while (left := at - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


@dataclass
class Result:
    """One scenario's run; times are monotonic."""
    scenario: Scenario
    duration: float
    t0: float
    t1: float = None
    windows: list = field(default_factory=list)
    baseline: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    rss: dict = field(default_factory=dict)
    counters: list = field(default_factory=list)
    attacks: str = ""


def processes_of(stack, cluster):
    """The current [(name, stack.Process)] of a scenario, for the RSS sampler."""
    def current():
        procs = [(e.name, e) for e in stack.envoys] + [("bridge", stack.bridge)]
        if cluster is None:
            return procs + [("valkey", stack.valkey)]
        return procs + [(n.process.name, n.process) for n in cluster.nodes]
    return current


def chaos(scenario, stack, cluster, result):
    """Injects the scenario's faults in turn on the schedule; after each, waits for
    limiting to resume and probes it. Stops at the first fault the stack does not come
    back from."""
    last_ready = result.t0
    for k, planned in enumerate(fault_times(result.duration)):
        label, inject = scenario.faults[k % len(scenario.faults)]
        sleep_until(max(result.t0 + planned, last_ready + MIN_STEADY_S))
        window = Window(label, time.monotonic())
        result.windows.append(window)
        print(f"  {window.start - result.t0:5.0f} s  {label}", flush=True)
        try:
            window.note = inject(stack, cluster, k // len(scenario.faults))
        except Exception as e:  # noqa: BLE001 - whatever failed, the component is not back
            window.end, window.failed = time.monotonic(), True
            window.note = f"did not come back: {e}"
            return
        window.end = time.monotonic()
        window.recovered = wait_limiting(stack, f"{scenario.name}-{k}")
        if window.recovered is None:
            window.failed = True
            window.note += f"; limiting did not resume within {RECOVERY_TIMEOUT_S:.0f} s"
            return
        window.probe = probe(stack, f"{scenario.name}-{k}")
        last_ready = time.monotonic()


def write_records(workdir, result):
    """requests.csv (every steady-load request) and rss.csv (every memory sample), times
    in seconds from the start of the load, kept with the logs when the soak fails."""
    with open(workdir / "requests.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["sent_s", "latency_ms", "gateway", "status"])
        for sent, latency, status, gateway in sorted(result.requests):
            rows.writerow([f"{sent - result.t0:.4f}", f"{latency * 1000:.2f}", gateway, status])
    with open(workdir / "rss.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["t_s", "process", "pid", "rss_kib"])
        for (name, pid), samples in result.rss.items():
            rows.writerows([f"{t - result.t0:.1f}", name, pid, kib] for t, kib in samples)


def run_scenario(scenario, duration, rate, workdir):
    """Starts the scenario's stack, runs the load, the sampler and the chaos for
    `duration` seconds (longer if needed for the last fault's grace and some steady time
    after it), stops everything; returns the Result."""
    workdir = Path(workdir) / scenario.name
    workdir.mkdir()
    cluster = stack = load = sampler = attacks = None
    try:
        if scenario.cluster:
            cluster = ValkeyCluster(3, replicas=1)
            atexit.register(cluster.close)
            cluster.start()
        options = {}
        if scenario.attacked:
            token = workdir / "token"
            token.write_text(TOKEN)
            options = {"bridge_args": ["--token-file", str(token),
                                       "--max-connections", str(ATTACK_SLOTS)],
                       "valkey_args": VALKEY_MEMORY}
        plugin = attacked_plugin() if scenario.attacked else PLUGIN
        stack = Stack(plugin, gateways=2, cluster=cluster, workdir=str(workdir), **options).start()
        result = Result(scenario, duration, t0=time.monotonic())
        load = Load(stack.ports, rate, USERS, WORKERS).start()
        sampler = RssSampler(processes_of(stack, cluster)).start()
        if scenario.attacked:
            attacks = Attacks(stack, TOKEN, ATTACK_SLOTS, FRESH_RATE, FRESH_PATH,
                              "x-fresh-id").start()
        result.baseline = probe(stack, f"{scenario.name}-baseline")
        chaos(scenario, stack, cluster, result)
        tail = result.windows[-1].end + GRACE_S + MIN_STEADY_S if result.windows else 0
        sleep_until(max(result.t0 + duration, tail))
        if attacks is not None:
            attacks.stop()
            evicted = stack.redis("INFO", "stats").get("evicted_keys", "?")
            result.attacks = f"{attacks.summary()}; Valkey evicted {evicted} keys"
        load.stop()
        sampler.stop()
        result.t1 = time.monotonic()
        result.counters = [stack.stats(g) for g in range(len(stack.ports))]
        result.requests, result.rss = load.requests(), sampler.samples
        write_records(workdir, result)
        return result
    finally:
        for part in (attacks, load, sampler):
            if part is not None:
                part.stop()
        if stack is not None:
            stack.close()
        if cluster is not None:
            for node in cluster.nodes:
                if Path(node.process.log).exists():
                    shutil.copy(node.process.log, workdir)
            cluster.close()


# The analysis: where each steady-load request falls, what it was answered.

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
    return Analysis(zones, per_window, checks, rss_rows)


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


# The report.

def describe(statuses):
    """{200: 3, 0: 1} -> "200: 3, no answer: 1"."""
    return ", ".join(f"{'no answer' if s == 0 else s}: {n}" for s, n in sorted(statuses.items()))


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
        + (f"\n\nAttacks, all along: {result.attacks}." if result.attacks else ""),
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 10)),
                        help="length of the run, split between the scenarios (default "
                             "$SOAK_MINUTES or 10; 1 for a quick check)")
    parser.add_argument("--rate", type=float, default=RATE, help="steady requests/s in all")
    parser.add_argument("--out", default=str(ROOT / "testbed" / "SOAK.md"), help="the report")
    parser.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS],
                        help="run only this scenario (repeatable; default: all)")
    args = parser.parse_args()
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    if not 0.5 <= args.minutes <= 120:
        parser.error("--minutes must be within 0.5..120")
    if not 10 <= args.rate <= 1000:
        parser.error("--rate must be within 10..1000 (a soak, not a benchmark)")
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (a background
    # job); SIGTERM and SIGHUP leave through `finally` too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    workdir = tempfile.mkdtemp(prefix="ratelimit-soak-")
    per_scenario = args.minutes * 60 / len(scenarios)
    started, began, load_before = time.time(), time.monotonic(), os.getloadavg()[0]
    passed = False
    try:
        results = []
        for scenario in scenarios:
            print(f"{scenario.name}: {scenario.title}; {per_scenario:.0f} s of load", flush=True)
            results.append(run_scenario(scenario, per_scenario, args.rate, workdir))
        analyses = [analyse(r) for r in results]
        text, passed = report(results, analyses, args, started,
                              (load_before, os.getloadavg()[0]), time.monotonic() - began)
        print("\n" + text)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    finally:
        if passed:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"soak failed or interrupted; logs, requests.csv and rss.csv kept in {workdir}",
                  file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
