"""The same filter as a native Envoy dynamic module (dist/libratelimit.so), a section of
`make bench` (issue 42): the same Envoy (`--concurrency 1`), the same load (100,000 distinct
users, every request allowed and exactly checked), four ways: no filter, the no-op wasm
filter, ratelimit.wasm through the bridge's gRPC stream, and the module (each check its own
callout to the bridge). Every request goes through to the gateway's upstream listener.

Standalone: `.venv/bin/python -m bench.module [--smoke]` (after `make bench-build`).
"""

from pathlib import Path

from . import alone, smoke
from .cells import ms, statuses
from .diagnostics import Probe
from .envoys import Gateway
from .measure import LEASE, ONCE_A_DAY, UNLIMITED, measured_run, plugin, summarise

USERS = 100_000
IN_FLIGHT = (16, 64)
HEADERS = [f"x-user-id: u{{n % {USERS}}}"]
CONFIGS = [
    {"key": "none", "label": "Envoy, no filter", "kind": "none", "plugin": None},
    {"key": "noop", "label": "Envoy + no-op wasm", "kind": "noop", "plugin": None},
    {"key": "wasm", "label": "ratelimit.wasm → bridge (gRPC stream)", "kind": "ratelimit",
     "plugin": plugin({"name": "exact", "limit": UNLIMITED})},
    {"key": "module", "label": "libratelimit.so → bridge (a callout per check)",
     "kind": "module", "plugin": plugin({"name": "exact", "limit": UNLIMITED})},
    # One hot user: its lease answers nearly every request without the bridge.
    {"key": "wlease", "label": "ratelimit.wasm, leased", "kind": "ratelimit",
     "plugin": plugin({"name": "leased", "limit": UNLIMITED, "lease": LEASE}),
     "headers": ["x-user-id: hot"]},
    {"key": "mlease", "label": "libratelimit.so, leased", "kind": "module",
     "plugin": plugin({"name": "leased", "limit": UNLIMITED, "lease": LEASE}),
     "headers": ["x-user-id: hot"]},
    # One user over its limit: the deny cache answers 429 without the bridge.
    {"key": "wdeny", "label": "ratelimit.wasm, denied", "kind": "ratelimit",
     "plugin": plugin({"name": "denied", "limit": ONCE_A_DAY}), "headers": ["x-user-id: done"]},
    {"key": "mdeny", "label": "libratelimit.so, denied", "kind": "module",
     "plugin": plugin({"name": "denied", "limit": ONCE_A_DAY}), "headers": ["x-user-id: done"]},
]


def settings(short):
    """The section's settings in run.py's: `short` for the smoke run."""
    return dict(module_rounds=1, module_duration=1.0, module_warmup=0.3) if short else \
        dict(module_rounds=3, module_duration=5.0, module_warmup=1.0)


def bridge_args(workdir):
    """No flags of its own."""
    return []


def measure(bench, workdir, conf):
    """Every run of the section, through `bench`'s bridge (started with `bridge_args`) and
    Valkey; returns the results' "rls" entry."""
    workdir = Path(workdir) / "module"
    workdir.mkdir(parents=True, exist_ok=True)
    timing = {"warmup": conf["module_warmup"], "duration": conf["module_duration"]}
    gateways, probes = {}, {}
    runs = {(c["key"], n): [] for c in CONFIGS for n in IN_FLIGHT}
    totals = {(c["key"], n): {} for c in CONFIGS for n in IN_FLIGHT}
    try:
        for c in CONFIGS:
            gw = Gateway(f"envoy-module-{c['key']}", c["kind"], workdir, bench.bridge_port,
                         c["plugin"], base="proxy")
            gateways[c["key"]] = gw.start()
            probes[c["key"]] = Probe(gw, bench.redis_port, bridge=bench.bridge.proc)
        for rnd in range(conf["module_rounds"]):
            for n in IN_FLIGHT:
                for c in CONFIGS:
                    key = (c["key"], n)
                    r = measured_run(str(workdir), f"module-{c['key']}-c{n}-round{rnd}",
                                     gateways[c["key"]], probes[c["key"]], totals[key],
                                     {"headers": HEADERS, **c}, n, timing)
                    runs[key].append(r)
                    print(f"  round {rnd + 1} {n:3} in flight {c['key']:>6}: {r['rps']:7.0f} rps"
                          f"  p99 {r['latency_us']['p99']:7.0f} us  {r['status']}", flush=True)
    finally:
        for probe in probes.values():
            probe.close()
        for gw in gateways.values():
            gw.stop()
    out = {"users": USERS, "rounds": conf["module_rounds"], "duration_s": conf["module_duration"],
           "configs": []}
    for c in CONFIGS:
        levels = []
        for n in IN_FLIGHT:
            summary = summarise(runs[(c["key"], n)])
            requests = max(1, sum(r["responses"] for r in summary["runs"]))
            total = totals[(c["key"], n)]
            levels.append({"in_flight": n, **summary, "cpu_us_per_request": {
                k.removesuffix("_cpu_us"): v / requests
                for k, v in total.items() if k.endswith("_cpu_us")}})
        out["configs"].append({**c, "levels": levels})
    return out


def cpu(level):
    per = level["cpu_us_per_request"]
    parts = [per.get(p) for p in ("envoy", "bridge", "valkey")]
    total = sum(p for p in parts if p is not None)
    return " | ".join("-" if p is None else f"{p:.0f}" for p in parts) + f" | {total:.0f}"


def section(r):
    """The section of REPORT.md."""
    rows = []
    for c in r["configs"]:
        for lv in c["levels"]:
            errors = f", {lv['errors']} errors" if lv["errors"] else ""
            rows.append(f"| {c['label']} | {lv['in_flight']} | {lv['rps']:.0f} | "
                        f"{ms(lv['p99'])} | {cpu(lv)} | {statuses(lv['status'])}{errors} |")
    table = "\n".join([
        "| configuration | in flight | req/s | p99 ms | CPU µs per request: Envoy | bridge "
        "| Valkey | all three | statuses |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|", *rows])
    return f"""## The filter as a native dynamic module

One Envoy (`--concurrency 1`) proxying to its own upstream listener, {r['users']:,} users
(`x-user-id: u{{n % {r['users']}}}`), every request exactly checked and allowed:
ratelimit.wasm on its gRPC stream to the bridge, or Envoy's `ratelimit` filter calling the
bridge's `ShouldRateLimit` (one unary gRPC call per request, a descriptor from the header),
beside no filter and the no-op wasm filter. {r['rounds']} round(s) of
{r['duration_s']:g} s per configuration and level, interleaved; req/s and p99 are medians
over rounds; CPU is each process's over every measured run, per request (Envoy and the
bridge from /proc, Valkey from `INFO cpu`; the baselines touch neither the bridge nor
Valkey, whose numbers there are their idle cost).

{table}
"""


def main():
    alone.run("module", __doc__, measure, settings, section, None, bridge_args)


if __name__ == "__main__":
    main()
