"""`python -m testbed.soak.regions` (`make soak-regions`): global rules across three regions
(testbed/regions.py) for minutes under a random fault schedule, judged by the bound's
checker. Two global rules of 20 a second homed in region a, one `deny` and one keeping a
share of 0.1, each asked 3x its rate from the three regions; about every 30 s a fault: the
latency between regions changes (0, 40, 150 ms), the hotspot moves (uniform or 90/10), a
region is cut off for 2 or 30 s (and once for 300 s in a run of 10 minutes or more), a
region's bridge is killed and restarted, and once the home's Valkey fails over to a replica
that missed its last grants. Throughout, b's bridge runs on a clock 0.9 % slow and c's on
one 1 % fast (the default drift is 1 %). Every answer is logged against one clock; the
checks:

- within the bound: `excess` (a sound count) at most 0 for windows of 0.1, 1, 10 and 60 s,
  for each rule, over the whole run, faults and all;
- the rate: at least 95 % of what the rule can admit in every 60 s window untouched by a
  cut, a kill or the failover (until two lease lifetimes after each): the rate for `deny`;
  for a share, the rate less `(regions - 1) x share` (a region spends its share only when
  its leases cannot pay, so under skewed demand the others' shares may go unused);
- a share kept: while a region is cut off from a `share` rule's home, the others admit at
  most `(1 - share) x (burst + rate x t)`.

Writes testbed/SOAK-REGIONS.md; the answers go to a CSV kept with the logs when a check
fails."""

import argparse
import csv
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..plugins import plugin, rule
from ..regions import Demand, World, excess
from ..stack import ROOT
from .report import table

RATE = 20  # a second, and the burst
SHARE = 0.1
RULES = {"deny": None, "share": SHARE}
TTL_S = 2.0  # lease_ttl's default
WINDOWS = (0.1, 1, 10, 60)
SPACING_S = 30.0
RTTS = (0, 40, 150)
CUTS_S = (2, 30)
LONG_CUT_S = 300
KILL_DOWN_S = 5.0
# The first faults only move the latency and the hotspot: some 60 s are judged for the rate.
BENIGN_FIRST = 3
SETTLE_S = 2 * TTL_S  # after a cut, a kill or the failover, before the rate is judged again
RATE_FLOOR = 0.95
# The bridges' clocks against true time (the home's, a's, is true): within the default
# --region-drift-ppm (1 %), slow and fast.
CLOCKS = {"b": 0.991, "c": 1.01}


def config():
    rules = []
    for name, share in RULES.items():
        r = rule(name, ["api_key"], RATE, per="1s", match={"path_prefix": f"/{name}/"})
        r["global"] = {"home": "a", **({"partition": {"share": share}} if share else {})}
        rules.append(r)
    return plugin(*rules, identity={"api_key": {"header": "x-api-key"}}, timeout_ms=2000)


def spread(hot):
    """Each region's demand, 3x the rate in all: uniform, or 90 % on `hot`."""
    if hot is None:
        return {r: RATE for r in "abc"}
    return {r: (2.7 if r == hot else 0.15) * RATE for r in "abc"}


@dataclass
class Event:
    kind: str
    start: float
    end: float
    region: str = ""
    note: str = ""

    @property
    def disruptive(self):
        return self.kind in ("cut", "kill", "failover")


class Schedule:
    """The faults, drawn from `rng`, one at a time, each returning an Event."""

    def __init__(self, world, demands, rng, seconds):
        self.world, self.demands, self.rng = world, demands, rng
        self.rtt, self.hot = 0, None
        self.long_cut = seconds >= 600
        self.failed_over = False
        self.seconds = seconds

    def latency(self):
        self.rtt = self.rng.choice([r for r in RTTS if r != self.rtt])
        self.world.set_latency(self.rtt)
        now = time.monotonic()
        return Event("latency", now, now, note=f"{self.rtt} ms round trip")

    def hotspot(self):
        self.hot = self.rng.choice([h for h in (None, "a", "b", "c") if h != self.hot])
        for d in self.demands.values():
            d.set_rates(spread(self.hot))
        now = time.monotonic()
        return Event("hotspot", now, now, note=f"90 % on {self.hot}" if self.hot else "uniform")

    def cut(self, seconds=None):
        region = self.rng.choice("abc")
        if seconds is None:
            seconds = self.rng.choice(CUTS_S)
        start = time.monotonic()
        self.world.cut(region)
        time.sleep(seconds)
        self.world.cut(region, False)
        return Event("cut", start, time.monotonic(), region, f"{seconds} s")

    def kill(self):
        region = self.rng.choice("abc")
        stack = self.world.regions[region]
        start = time.monotonic()
        stack.bridge.kill()
        time.sleep(KILL_DOWN_S)
        stack.start_bridge()
        return Event("kill", start, time.monotonic(), region,
                     f"bridge SIGKILL, restarted {KILL_DOWN_S:g} s later")

    def failover(self):
        self.failed_over = True
        start = time.monotonic()
        self.world.fail_over()
        return Event("failover", start, time.monotonic(), "a",
                     "primary SIGKILL, replica promoted, every bridge moved to it")

    def next(self, n, elapsed):
        if n < BENIGN_FIRST:
            return self.rng.choice([self.latency, self.hotspot])()
        if self.long_cut and elapsed > self.seconds / 4:
            self.long_cut = False
            return self.cut(LONG_CUT_S)
        if not self.failed_over and elapsed > self.seconds / 3:
            return self.failover()
        return self.rng.choice([self.latency, self.hotspot, self.cut, self.cut, self.kill])()


def run(seconds, seed, workdir):
    """The world, the demand and the schedule for `seconds`; returns (answers per rule,
    events, start, end)."""
    rng = random.Random(seed)
    world = World(config(), replica_of="a", clocks=CLOCKS)
    demands = {}
    events = []
    try:
        world.start()
        time.sleep(1.1)  # past the ledgers' learning on fresh servers
        headers = {"x-api-key": "tenant"}
        demands = {name: Demand(world, spread(None), headers, path=f"/{name}/x").start()
                   for name in RULES}
        start = time.monotonic()
        schedule = Schedule(world, demands, rng, seconds)
        n = 0
        while True:
            pause = rng.uniform(0.5, 1.5) * SPACING_S
            if time.monotonic() + pause >= start + seconds:
                break
            time.sleep(pause)
            events.append(schedule.next(n, time.monotonic() - start))
            e = events[-1]
            print(f"  {e.start - start:6.1f} s  {e.kind:8} {e.region:1}  {e.note}", flush=True)
            n += 1
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        end = time.monotonic()
        answers = {name: d.stop() for name, d in demands.items()}
    finally:
        for d in demands.values():
            d.stop()
        world.close()
        for region, stack in world.regions.items():
            for proc in [stack.bridge, *stack.envoys]:
                if Path(proc.log).exists():
                    shutil.copy(proc.log, Path(workdir) / f"{region}-{Path(proc.log).name}")
    return answers, events, start, end


def quiet_windows(events, start, end, length=60.0, step=5.0):
    """The windows of `length` s, one every `step` s, that no disruptive fault touches
    (from its start to SETTLE_S after its end)."""
    out, t = [], start + 5.0
    while t + length <= end:
        if not any(e.disruptive and e.start < t + length and t < e.end + SETTLE_S
                   for e in events):
            out.append(t)
        t += step
    return out


def admissible(name):
    """The share of the rate rule `name` can surely admit under any spread of demand."""
    share = RULES[name] or 0
    return 1 - (len("abc") - 1) * share


def judge(answers, events, start, end):
    """[(check, ok, detail)]."""
    checks = []
    for name, log in answers.items():
        worst = {w: excess(log, RATE, RATE, w) for w in WINDOWS}
        checks.append((f"{name}: within burst + rate x t", all(e <= 0 for e in worst.values()),
                       ", ".join(f"{w:g} s: {e:+.0f}" for w, e in worst.items())))
        windows = quiet_windows(events, start, end)
        shares = [sum(1 for a in log if a.status == 200 and t <= a.sent < t + 60) / (RATE * 60)
                  for t in windows]
        floor = RATE_FLOOR * admissible(name)
        checks.append((f"{name}: {floor:.0%} of the rate over 60 s without faults",
                       bool(shares) and min(shares) >= floor,
                       f"{len(shares)} windows, least {min(shares):.1%}" if shares
                       else "no window without a fault: not judged"))
    share_log = answers["share"]
    worst_cut = None
    for e in events:
        if e.kind != "cut" or e.region == "a" or e.end - e.start < TTL_S + 1:
            continue
        # The region's leases may last TTL_S into the cut; the others' are judged after.
        span = e.end - e.start - TTL_S
        others = sum(1 for a in share_log if a.status == 200 and a.region != e.region
                     and e.start + TTL_S <= a.sent < e.end)
        ratio = others / ((1 - SHARE) * (RATE + RATE * span))
        worst_cut = max(worst_cut or 0.0, ratio)
    checks.append(("share: the others keep to rate - share while a region is cut off",
                   worst_cut is None or worst_cut <= 1.0,
                   "no cut of 3 s or more" if worst_cut is None
                   else f"worst {worst_cut:.3f} of (1 - share) x (burst + rate x t)"))
    return checks


def write_answers(path, answers, start):
    with open(path, "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["rule", "sent_s", "done_s", "region", "status"])
        for name, log in answers.items():
            rows.writerows([name, f"{a.sent - start:.4f}", f"{a.done - start:.4f}", a.region,
                            a.status] for a in log)


def report(args, seed, answers, events, start, end, checks, elapsed):
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, timeout=10).stdout.strip()
    passed = all(ok for _, ok, _ in checks)
    intro = (
        f"`python -m testbed.soak.regions --minutes {args.minutes:g} --seed {seed}` "
        f"(`make soak-regions`), {time.strftime('%Y-%m-%d %H:%M UTC')}, commit {commit or '?'}, "
        f"{os.cpu_count()} cores, {elapsed / 60:.1f} minutes in all. "
        f"**{'PASS' if passed else 'FAIL'}**.\n\n"
        + " ".join(__doc__.split("\n\n", 1)[0].split()).split("checker. ", 1)[1])
    counts = ", ".join(f"{name}: {sum(a.status == 200 for a in log)} admitted of {len(log)}"
                       for name, log in answers.items())
    fault_rows = [(i + 1, e.kind, e.region or "-", f"{e.start - start:.1f}",
                   f"{e.end - e.start:.1f}", e.note) for i, e in enumerate(events)]
    text = "\n\n".join([
        "# Soak: several regions, one limit", intro,
        "## Checks\n\n" + table(("check", "result", "detail"),
                                [(c, "ok" if ok else "FAIL", d) for c, ok, d in checks]),
        f"## Faults\n\n{end - start:.0f} s of demand; {counts}.\n\n"
        + table(("#", "fault", "region", "at s", "lasted s", "what"), fault_rows),
    ]) + "\n"
    return text, passed


def main():
    parser = argparse.ArgumentParser(prog="python -m testbed.soak.regions",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 10)))
    parser.add_argument("--seed", type=int, default=None, help="the schedule's (default: random)")
    parser.add_argument("--out", default=str(ROOT / "testbed" / "SOAK-REGIONS.md"))
    args = parser.parse_args()
    if not 1 <= args.minutes <= 120:
        parser.error("--minutes must be within 1..120")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    workdir = tempfile.mkdtemp(prefix="ratelimit-soak-regions-")
    began = time.monotonic()
    print(f"several regions, seed {seed}, {args.minutes:g} minutes; logs in {workdir}", flush=True)
    answers, events, start, end = run(args.minutes * 60, seed, workdir)
    checks = judge(answers, events, start, end)
    text, passed = report(args, seed, answers, events, start, end, checks,
                          time.monotonic() - began)
    print("\n" + text)
    Path(args.out).write_text(text)
    if passed:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        write_answers(Path(workdir) / "answers.csv", answers, start)
        print(f"soak failed; logs and answers.csv kept in {workdir}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
