"""The same filter as a native Envoy dynamic module (dist/libratelimit.so), a section of
`make bench` (issue 42): the same Envoy (`--concurrency 1`), the same load (100,000 distinct
users, every request allowed and exactly checked), four ways: no filter, the no-op wasm
filter, ratelimit.wasm through the bridge's gRPC stream, and the module (group commit on
the worker's gRPC stream, which Envoy's main thread holds for it; and over HTTP callouts
from the main thread, `transport: "http"`). Every request goes through to the gateway's
upstream listener.

Standalone: `.venv/bin/python -m bench.module [--smoke]` (after `make bench-build`).
"""

from . import alone, side_by_side, smoke
from .measure import LEASE, ONCE_A_DAY, UNLIMITED, plugin
from .side_by_side import BASELINES, HEADERS, IN_FLIGHT, USERS, level

CONFIGS = [
    *BASELINES,
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
    """The issue's goals, each with what was measured and whether it was met: the module's
    req/s against no filter's at 64 in flight (exact >= 0.9x, leased and denied >= 0.97x),
    and Envoy's CPU per request with the module's exact check against the no-op wasm's."""
    none = level(r, "none", 64)["rps"]
    out = [(f"{label} at 64 in flight, req/s / no filter's", level(r, key, 64)["rps"] / none,
            floor) for key, label, floor in (("module", "exact", 0.9), ("mlease", "leased", 0.97),
                                             ("mdeny", "denied", 0.97))]
    rows = [(f"{what} ≥ {floor}", f"{ratio:.2f}", ratio >= floor) for what, ratio, floor in out]
    for n in IN_FLIGHT:
        module = level(r, "module", n)["cpu_us_per_request"].get("envoy", 0)
        noop = level(r, "noop", n)["cpu_us_per_request"].get("envoy", 0)
        rows.append((f"Envoy CPU per request, exact at {n} in flight, below the no-op wasm's",
                     f"{module:.0f} µs against {noop:.0f}", module < noop))
    return rows


def section(r):
    """The section of REPORT.md."""
    judged = "\n".join(["| goal | measured | met |", "|---|---:|---|",
                        *(f"| {what} | {got} | {'yes' if met else '**no**'} |"
                          for what, got, met in goals(r))])
    return f"""## The filter as a native dynamic module

One Envoy (`--concurrency 1`) proxying to its own upstream listener: no filter, the no-op
wasm filter, ratelimit.wasm (checks on its gRPC stream to the bridge) and the same filter
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

Goals (issue 42):

{judged}
"""


def main():
    alone.run("module", __doc__, measure, settings, section, smoke.check_module)


if __name__ == "__main__":
    main()
