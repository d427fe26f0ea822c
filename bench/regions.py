"""Several regions, one limit, a section of `make bench` (issue 39): global rules on three
regions on this machine (testbed/regions.py: per region a Valkey, a bridge and an Envoy,
every cross-region connection through a fault-injecting proxy).

- **Cases**: demand of 3x the rate, uniform at 150 ms between regions and 90/10 at 40 ms;
  a region cut off for a third of the run (its share kept); a region killed at a third.
  For each: the worst admitted / bound over windows of 0.1, 1, 10 (and 60) s (the sound
  count of testbed/regions.py `excess`: at most 1.0 keeps the bound), the share of the rate
  admitted after the first second, the tokens stranded (expired unspent and not returned,
  or lost), and the ledger calls per second for the one key.
- **A cold key outside its home**: the first request of fresh keys in a region 150 ms from
  their home: what it waits (p50, p99), against a warm key's.
- **The hot path's Redis**: loadgen on one region's gateway with a global rule and with the
  same rule regional, Redis CPU per check (`INFO cpu`) on that region's Valkey and on the
  home's, and the gateway's req/s.

Standalone: `.venv/bin/python -m bench.regions [--smoke]` (after `make build bench-build`).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from testbed.regions import Demand, World, admitted, excess
from testbed.stack import request

from .diagnostics import process_cpu_seconds
from .measure import loadgen

RATE = 20
TTL_MS = 500
CPU_RATE = 1_000_000  # a limit never reached: the hot path alone


def settings(short):
    """The section's settings in run.py's (the full section takes about 3 minutes)."""
    return dict(region_seconds=3.0, region_cold_keys=4, region_load_s=1.0) if short else \
        dict(region_seconds=20.0, region_cold_keys=20, region_load_s=6.0)


def plugin(share=None, home="a", rate=RATE, global_=True, ttl_ms=TTL_MS):
    rule = {"name": "tenant", "key": ["api_key"], "limit": {"requests": rate, "per": "1s"}}
    if global_:
        rule["global"] = {"home": home, "lease_ttl": f"{ttl_ms}ms"}
        if share:
            rule["global"]["partition"] = {"share": share}
    return {"backend": {"cluster": "ratelimit_bridge", "timeout_ms": 2000},
            "failure_mode": "closed", "identity": {"api_key": {"header": "x-api-key"}},
            "rules": [rule]}


def lease_metrics(world):
    """Every running bridge's global_lease* counters summed: {(name, event): value}. A
    killed bridge's counters died with it."""
    total = {}
    for region in world.regions.values():
        if region.bridge.proc.poll() is not None:
            continue
        _, _, body = request(region.bridge_port, "/metrics", timeout=5)
        for line in body.splitlines():
            if line.startswith("ratelimit_bridge_global_lease") and "{" in line:
                name, rest = line.split("{", 1)
                event = rest.split('event="', 1)[1].split('"', 1)[0]
                key = (name.removesuffix("_total"), event)
                total[key] = total.get(key, 0) + float(rest.rsplit(" ", 1)[1])
    return total


CASES = [
    {"key": "uniform-150", "label": "3x the rate, uniform, 150 ms between regions",
     "rtt": 150, "rates": {"a": RATE, "b": RATE, "c": RATE}},
    {"key": "skewed-40", "label": "3x the rate, 90/10, 40 ms", "rtt": 40,
     "rates": {"a": 2.7 * RATE, "b": 0.15 * RATE, "c": 0.15 * RATE}},
    {"key": "cut-share", "label": "c cut off for a third of the run, share 0.1", "rtt": 40,
     "rates": {"a": RATE, "b": RATE, "c": RATE}, "share": 0.1, "fault": "cut"},
    {"key": "killed", "label": "c's bridge killed at a third of the run", "rtt": 40,
     "rates": {"a": RATE, "b": RATE, "c": RATE}, "fault": "kill"},
]


def run_case(case, seconds):
    world = World(plugin(share=case.get("share"))).start()
    try:
        time.sleep(1.1)  # past the ledgers' learning on fresh servers
        world.set_latency(case["rtt"])
        demand = Demand(world, case["rates"], {"x-api-key": "tenant-1"}).start()
        start = time.monotonic()
        fault = case.get("fault")
        if fault:
            time.sleep(seconds / 3)
            if fault == "cut":
                world.cut("c")
                time.sleep(seconds / 3)
                world.cut("c", False)
            else:
                world.regions["c"].bridge.kill()
                demand.set_rates({"a": 1.5 * RATE, "b": 1.5 * RATE, "c": 0})
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        answers = demand.stop()
        time.sleep(2 * TTL_MS / 1000)  # the last leases end and go back
        metrics = lease_metrics(world)
    finally:
        world.close()
    windows = [w for w in (0.1, 1, 10, 60) if w <= seconds]
    worst = max((excess(answers, RATE, RATE, w) + RATE + RATE * w) / (RATE + RATE * w)
                for w in windows)
    steady = [a for a in admitted(answers) if a.sent >= start + 1]

    def tokens(event):
        return metrics.get(("ratelimit_bridge_global_lease_tokens", event), 0)

    calls = sum(v for (name, event), v in metrics.items()
                if name == "ratelimit_bridge_global_leases" and event != "expired")
    return {**{k: v for k, v in case.items() if k != "rates"}, "windows": windows,
            "admitted_over_bound": worst, "rate_share": len(steady) / (RATE * (seconds - 1)),
            "stranded": tokens("expired") - tokens("returned") + tokens("stranded"),
            "granted": tokens("granted"), "ledger_calls_per_s": calls / seconds}


def cold_keys(n):
    """The first request of `n` fresh keys in region c, 150 ms from their home a, and the
    requests of each once warm (its leases keeping up: the 6th to the 10th of a request
    every 100 ms, half the rate): their latencies in ms."""
    world = World(plugin()).start()
    try:
        # Past the home ledger's learning after its start (Redis counts its uptime in
        # whole seconds): at 1.1 s, CI once saw a fresh key refused (429).
        time.sleep(2.5)
        world.set_latency(150)
        port = world.regions["c"].ports[0]
        cold, warm = [], []
        for i in range(n):
            for j in range(10):
                sent = time.monotonic()
                status, _, _ = request(port, "/api/global", {"x-api-key": f"cold-{i}"})
                took = time.monotonic() - sent
                assert status == 200, status
                (cold if j == 0 else warm if j >= 5 else []).append(took * 1000)
                time.sleep(max(0.0, 0.1 - took))
    finally:
        world.close()
    def q(xs, p):
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]

    return {"keys": n, "cold_p50_ms": q(cold, 0.5), "cold_p99_ms": q(cold, 0.99),
            "warm_p50_ms": q(warm, 0.5), "warm_p99_ms": q(warm, 0.99)}


def redis_cpu_us(stack):
    info = stack.redis("INFO", "cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def process_cpu_us(process):
    return process_cpu_seconds(process.proc.pid) * 1e6


def hot_path(workdir, seconds):
    """loadgen on region b's gateway (home a), 16 in flight over 1,000 keys, the lease_ttl
    the default (2 s): CPU per check of b's Valkey, bridge and Envoy, and of a's Valkey
    (the ledgers'), for the rule global and regional."""
    out = {}
    for kind in ("global", "regional"):
        world = World(plugin(rate=CPU_RATE, global_=kind == "global", ttl_ms=2000)).start()
        try:
            time.sleep(1.1)
            url = f"http://127.0.0.1:{world.regions['b'].ports[0]}/api/global"
            headers = ["x-api-key: k{n % 1000}"]
            loadgen(workdir, f"regions-{kind}-warmup", [url], 1.0, headers=headers)
            b = world.regions["b"]

            def cpu():
                return {"home_redis_us": redis_cpu_us(world.regions["a"]),
                        "local_redis_us": redis_cpu_us(b),
                        "bridge_us": process_cpu_us(b.bridge),
                        "envoy_us": process_cpu_us(b.envoys[0])}
            before = cpu()
            result = loadgen(workdir, f"regions-{kind}", [url], seconds, headers=headers)
            after = cpu()
        finally:
            world.close()
        checks = max(1, result["responses"])
        out[kind] = {"rps": result["rps"], "status": result["status"],
                     **{k: (after[k] - before[k]) / checks for k in before}}
    return out


def measure(workdir, conf):
    """The section's results entry."""
    workdir = Path(workdir) / "regions"
    workdir.mkdir(parents=True, exist_ok=True)
    cases = []
    for case in CASES:
        r = run_case(case, conf["region_seconds"])
        print(f"  {case['key']:>12}: admitted/bound {r['admitted_over_bound']:.3f}, "
              f"{r['rate_share']:.0%} of the rate, {r['stranded']:.0f} stranded, "
              f"{r['ledger_calls_per_s']:.1f} ledger calls/s", flush=True)
        cases.append(r)
    cold = cold_keys(conf["region_cold_keys"])
    print(f"  cold key outside its home: p50 {cold['cold_p50_ms']:.0f} ms, "
          f"p99 {cold['cold_p99_ms']:.0f} ms (warm p50 {cold['warm_p50_ms']:.1f})", flush=True)
    hot = hot_path(str(workdir), conf["region_load_s"])
    print("  hot path: " + ", ".join(f"{k} {v['rps']:.0f} rps, {v['local_redis_us']:.1f} us "
                                     f"local Redis/check" for k, v in hot.items()), flush=True)
    return {"rate": RATE, "ttl_ms": TTL_MS, "seconds": conf["region_seconds"], "cases": cases,
            "cold": cold, "hot_path": hot}


def section(r):
    """The report's Markdown for the section."""
    rows = "\n".join(
        f"| {c['label']} | {', '.join(f'{w:g}' for w in c['windows'])} | "
        f"{c['admitted_over_bound']:.3f} | {c['rate_share']:.0%} | {c['stranded']:.0f} | "
        f"{c['granted']:.0f} | {c['ledger_calls_per_s']:.1f} |" for c in r["cases"])
    cold, hot = r["cold"], r["hot_path"]
    hot_rows = "\n".join(
        f"| {kind} | {v['rps']:.0f} | {v['envoy_us']:.1f} | {v['bridge_us']:.1f} | "
        f"{v['local_redis_us']:.2f} | {v['home_redis_us']:.2f} |"
        for kind, v in hot.items())
    return f"""## Several regions, one limit (global rules)

Three regions on this machine (`bench/regions.py`, testbed/regions.py), one key of a rule of
{r['rate']} a second (burst {r['rate']}), leases of {r['ttl_ms']} ms, {r['seconds']:g} s per
case. *Admitted / bound* is the worst, over the windows, of the admissions that surely
happened in a window over `burst + rate x t` (at most 1 keeps the bound); *of the rate*
counts admissions after the first second; *stranded* is tokens leased and neither spent
nor returned; *ledger calls* is every grant, return or refused ask, per second, for the
one key, over all bridges.

| case | windows s | admitted / bound | of the rate | stranded | granted | ledger calls/s |
|---|---|---:|---:|---:|---:|---:|
{rows}

A cold key outside its home (region c, 150 ms round trip from a): its first request waits
for the first grant, p50 {cold['cold_p50_ms']:.0f} ms and p99 {cold['cold_p99_ms']:.0f} ms over
{cold['keys']} keys; once warm (a request every 100 ms, the 6th to the 10th), p50
{cold['warm_p50_ms']:.1f} ms and p99 {cold['warm_p99_ms']:.1f} ms.

The hot path: loadgen on region b's gateway (home a), 16 in flight over 1,000 keys of a limit
never reached, leases of 2 s (the default), CPU per check of b's processes (`/proc`) and
Valkeys (`INFO cpu`). Every ledger call crosses the testbed's fault-injecting proxy, a
Python process on the same two cores, which is why the global rule's req/s is lower: read
the CPU columns.

| rule | req/s | Envoy µs/check, b | bridge µs/check, b | Redis µs/check, b | Redis µs/check, home a |
|---|---:|---:|---:|---:|---:|
{hot_rows}
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="short runs")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="ratelimit-bench-regions-")
    results = measure(workdir, settings(args.smoke))
    print(section(results))
    json.dump(results, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
