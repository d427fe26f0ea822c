"""The same filter as a native Envoy dynamic module (dist/libratelimit.so), a section of
`make bench` (issues 42 and 52): the same Envoy (`--concurrency 1`), the same load
(100,000 distinct users, every request allowed and exactly checked) through no filter,
Envoy's own `local_ratelimit` (allowing, and denying), the no-op wasm filter,
ratelimit.wasm through the bridge's gRPC stream, and the module (group commit on the
worker's gRPC stream, which Envoy's main thread holds for it; and over HTTP callouts from
the main thread, `transport: "http"`); then one hot user's leased checks and one denied
user's 429s, on both filters. Every request goes through to the gateway's upstream
listener. The goals of issue 52 are judged in the same run.

Standalone: `.venv/bin/python -m bench.module [--smoke]` (after `make bench-build`).
"""

from . import alone, side_by_side, smoke
from .measure import LEASE, ONCE_A_DAY, UNLIMITED, plugin
from .side_by_side import BASELINES, HEADERS, IN_FLIGHT, USERS, level

# Envoy's local_ratelimit: a bucket it never exhausts, and one the warm-up exhausts for good.
NEVER, EXHAUSTED = (10**6, 10**6), (0, 1)

CONFIGS = [
    *BASELINES,
    {"key": "local", "label": "Envoy's local_ratelimit, allowing", "kind": "local",
     "plugin": None, "local": NEVER},
    {"key": "ldeny", "label": "Envoy's local_ratelimit, denying", "kind": "local",
     "plugin": None, "local": EXHAUSTED},
    {"key": "module", "label": "libratelimit.so → bridge (gRPC stream, group commit)",
     "kind": "module", "plugin": plugin({"name": "exact", "limit": UNLIMITED})},
    {"key": "mhttp", "label": "libratelimit.so → bridge (HTTP callouts, group commit)",
     "kind": "module", "plugin": plugin({"name": "exact", "limit": UNLIMITED}, transport="http")},
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
    return dict(module_rounds=1, module_duration=smoke.RUN_S, module_warmup=smoke.WARMUP_S) if short else \
        dict(module_rounds=3, module_duration=5.0, module_warmup=1.0)


def measure(bench, workdir, conf):
    """Every run of the section, through `bench`'s bridge and Valkey; returns the results'
    "module" entry."""
    return {"users": USERS,
            **side_by_side.measure("module", bench, workdir, conf, CONFIGS, HEADERS)}


def goals(r):
    """Issue 52's goals at each level, each with what was measured and whether it was met:
    the module's leased path within 3 µs of Envoy CPU per request of `local_ratelimit`
    allowing, and at >= 0.97x no filter's req/s; its denied path within 3 µs of
    `local_ratelimit` denying, and at >= 0.97x its req/s (both answer 429 without an
    upstream, far faster than no filter); its exact check at >= 0.9x no filter's req/s and
    at most 10 µs of Envoy CPU per request above no filter's."""
    rows = []
    for n in IN_FLIGHT:
        def at(key):
            lv = level(r, key, n)
            return lv["rps"], lv["cpu_us_per_request"].get("envoy", 0)
        for key, label, against, name, most, floor in (
                ("mlease", "leased", "local", "local_ratelimit allowing", 3, 0.97),
                ("mdeny", "denied", "ldeny", "local_ratelimit denying", 3, 0.97),
                ("module", "exact", "none", "no filter", 10, 0.9)):
            (rps, cpu), (base_rps, base_cpu) = at(key), at(against)
            rps_base = base_rps if key == "mdeny" else at("none")[0]
            rps_name = name if key == "mdeny" else "no filter"
            rows.append((f"{label} at {n} in flight: Envoy CPU per request, above {name}'s, "
                         f"≤ {most} µs", f"{cpu - base_cpu:+.1f} µs ({cpu:.1f} against "
                         f"{base_cpu:.1f})", cpu - base_cpu <= most))
            rows.append((f"{label} at {n} in flight: req/s / {rps_name}'s ≥ {floor}",
                         f"{rps / rps_base:.2f}", rps / rps_base >= floor))
    return rows


def section(r):
    """The section of REPORT.md."""
    judged = "\n".join(["| goal | measured | met |", "|---|---:|---|",
                        *(f"| {what} | {got} | {'yes' if met else '**no**'} |"
                          for what, got, met in goals(r))])
    return f"""## The filter as a native dynamic module

One Envoy (`--concurrency 1`) proxying to its own upstream listener: no filter, Envoy's
`local_ratelimit` (a bucket it never exhausts, and one it has: every request a 429), the
no-op wasm filter, ratelimit.wasm (checks on its gRPC stream to the bridge) and the same filter
as `dist/libratelimit.so` (checks batched by group commit into messages on the worker's
gRPC stream, which Envoy's main thread holds and feeds for it; or into HTTP callouts the
main thread sends, with `transport: "http"`). Exact:
{r['users']:,} users (`x-user-id: u{{n % {r['users']}}}`), every request checked and
allowed; leased: one hot user whose lease answers nearly every request; denied: one user
over its limit, answered 429 from the deny cache. {r['rounds']} round(s) of
{r['duration_s']:g} s per configuration and level, interleaved; req/s and p99 are medians
over rounds; CPU is each process's over every measured run, per request (Envoy and the
bridge from /proc, Valkey from `INFO cpu`; the baselines touch neither the bridge nor
Valkey, whose numbers there are their idle cost).

{side_by_side.table(r)}

Goals (issue 52), judged in this run:

{judged}
"""


def main():
    alone.run("module", __doc__, measure, settings, section, smoke.check_module)


if __name__ == "__main__":
    main()
