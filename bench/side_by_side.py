"""Configurations side by side on one Envoy each, as the rate limit service's section
(rls.py) and the dynamic module's (module.py) measure them: every configuration started
once, then rounds that interleave them at each level of requests in flight, with req/s,
p99 and each process's CPU per request (Envoy and the bridge from /proc, Valkey from
`INFO cpu`). This is the one copy of that loop and of its table."""

from pathlib import Path

from .cells import ms, num, statuses
from .diagnostics import EXCHANGES, Probe
from .envoys import Gateway
from .measure import UNLIMITED, measured_run, plugin, summarise

IN_FLIGHT = (16, 64)
USERS = 100_000
# Every request exactly checked and allowed: a different user of USERS each time.
HEADERS = [f"x-user-id: u{{n % {USERS}}}"]
# What each section sets its own configurations beside: Envoy alone, the no-op wasm
# filter, and ratelimit.wasm's exact check on its gRPC stream.
BASELINES = [
    {"key": "none", "label": "Envoy, no filter", "kind": "none", "plugin": None},
    {"key": "noop", "label": "Envoy + no-op wasm", "kind": "noop", "plugin": None},
    {"key": "wasm", "label": "ratelimit.wasm → bridge (gRPC stream)", "kind": "ratelimit",
     "plugin": plugin({"name": "exact", "limit": UNLIMITED})},
]


def measure(name, bench, workdir, conf, configs, headers):
    """Every run of section `name` (its settings `{name}_rounds`, `_duration`, `_warmup` in
    `conf`) through `bench`'s bridge and Valkey; `headers` unless a configuration has its
    own. The section's results: users aside, rounds, duration and each configuration's
    levels."""
    workdir = Path(workdir) / name
    workdir.mkdir(parents=True, exist_ok=True)
    timing = {"warmup": conf[f"{name}_warmup"], "duration": conf[f"{name}_duration"]}
    gateways, probes = {}, {}
    runs = {(c["key"], n): [] for c in configs for n in IN_FLIGHT}
    totals = {(c["key"], n): {} for c in configs for n in IN_FLIGHT}
    try:
        for c in configs:
            gw = Gateway(f"envoy-{name}-{c['key']}", c["kind"], workdir, bench.bridge_port,
                         c["plugin"], base="proxy", **({"local": c["local"]} if "local" in c else {}))
            gateways[c["key"]] = gw.start()
            probes[c["key"]] = Probe(gw, bench.redis_port, bridge=bench.bridge.proc)
        for rnd in range(conf[f"{name}_rounds"]):
            for n in IN_FLIGHT:
                for c in configs:
                    key = (c["key"], n)
                    r = measured_run(str(workdir), f"{name}-{c['key']}-c{n}-round{rnd}",
                                     gateways[c["key"]], probes[c["key"]], totals[key],
                                     {"headers": headers, **c}, n, timing)
                    runs[key].append(r)
                    print(f"  round {rnd + 1} {n:3} in flight {c['key']:>6}: {r['rps']:7.0f} rps"
                          f"  p99 {r['latency_us']['p99']:7.0f} us  {r['status']}", flush=True)
    finally:
        for probe in probes.values():
            probe.close()
        for gw in gateways.values():
            gw.stop()
    out = {"rounds": conf[f"{name}_rounds"], "duration_s": conf[f"{name}_duration"],
           "configs": []}
    for c in configs:
        levels = []
        for n in IN_FLIGHT:
            summary = summarise(runs[(c["key"], n)])
            requests = max(1, sum(r["responses"] for r in summary["runs"]))
            total = totals[(c["key"], n)]
            exchanges = sum(total.get(k, 0) for k in EXCHANGES)
            levels.append({"in_flight": n, **summary, "cpu_us_per_request": {
                k.removesuffix("_cpu_us"): v / requests
                for k, v in total.items() if k.endswith("_cpu_us")},
                "checks_per_exchange": total.get("checks_sent", 0) / exchanges
                if exchanges else None})
        out["configs"].append({**c, "levels": levels})
    return out


def level(r, key, in_flight):
    """Configuration `key`'s results at `in_flight`."""
    c = next(c for c in r["configs"] if c["key"] == key)
    return next(lv for lv in c["levels"] if lv["in_flight"] == in_flight)


def cpu(level):
    per = level["cpu_us_per_request"]
    parts = [per.get(p) for p in ("envoy", "bridge", "valkey")]
    total = sum(p for p in parts if p is not None)
    return " | ".join("-" if p is None else f"{p:.0f}" for p in parts) + f" | {total:.0f}"


def table(r):
    """The section's table: a row per configuration and level."""
    rows = []
    for c in r["configs"]:
        for lv in c["levels"]:
            errors = f", {lv['errors']} errors" if lv["errors"] else ""
            rows.append(f"| {c['label']} | {lv['in_flight']} | {lv['rps']:.0f} | "
                        f"{ms(lv['p99'])} | {cpu(lv)} | "
                        f"{num(lv.get('checks_per_exchange'), '.1f')} | "
                        f"{statuses(lv['status'])}{errors} |")
    return "\n".join([
        "| configuration | in flight | req/s | p99 ms | CPU µs per request: Envoy | bridge "
        "| Valkey | all three | checks per exchange | statuses |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", *rows])
