"""Envoy's own ratelimit filter with the bridge as its rate limit service, a section of
`make bench` (issue 41, item 6): the same Envoy (`--concurrency 1`), the same load (100,000
distinct users, every request allowed and exactly checked), four ways: no filter, the no-op
wasm filter, ratelimit.wasm through the bridge's gRPC stream, and Envoy's `ratelimit`
filter calling the bridge's `ShouldRateLimit` (`--rls-config`). Every request goes through
to the gateway's upstream listener (the `proxy` base of bench/envoys.py).

Reported per configuration and requests in flight: req/s, p99, and the CPU time each
process spent per request (Envoy from /proc, the bridge from /proc, Valkey from `INFO cpu`),
which a busy machine shifts far less than req/s. Rounds interleave the configurations.

Standalone: `.venv/bin/python -m bench.rls [--smoke]` (after `make bench-build`): starts its
own Valkey and a bridge serving the section's YAML, prints the section.
"""

from pathlib import Path

from . import alone, side_by_side, smoke
from .envoys import RLS_DOMAIN, RLS_KEY
from .measure import UNLIMITED
from .side_by_side import BASELINES, HEADERS, USERS

# The same limit as the wasm configuration's: a billion a second per user, never reached.
YAML = f"""domain: {RLS_DOMAIN}
descriptors:
  - key: {RLS_KEY}
    rate_limit: {{unit: second, requests_per_unit: {UNLIMITED['requests']}}}
"""

CONFIGS = [
    *BASELINES,
    {"key": "rls", "label": "Envoy's ratelimit filter → bridge (ShouldRateLimit)",
     "kind": "rls", "plugin": None},
]


def settings(short):
    """The section's settings in run.py's: `short` for the smoke run."""
    return dict(rls_rounds=1, rls_duration=smoke.RUN_S, rls_warmup=smoke.WARMUP_S) if short else \
        dict(rls_rounds=3, rls_duration=5.0, rls_warmup=1.0)


def bridge_args(workdir):
    """The bench bridge's flags for this section: the YAML, written into `workdir`."""
    path = Path(workdir) / "rls.yaml"
    path.write_text(YAML)
    return ["--rls-config", str(path)]


def measure(bench, workdir, conf):
    """Every run of the section, through `bench`'s bridge (started with `bridge_args`) and
    Valkey; returns the results' "rls" entry."""
    return {"users": USERS, **side_by_side.measure("rls", bench, workdir, conf, CONFIGS, HEADERS)}


def section(r):
    """The section of REPORT.md."""
    return f"""## Envoy's own ratelimit filter, the bridge as its rate limit service

One Envoy (`--concurrency 1`) proxying to its own upstream listener, {r['users']:,} users
(`x-user-id: u{{n % {r['users']}}}`), every request exactly checked and allowed:
ratelimit.wasm on its gRPC stream to the bridge, or Envoy's `ratelimit` filter calling the
bridge's `ShouldRateLimit` (one unary gRPC call per request, a descriptor from the header),
beside no filter and the no-op wasm filter. {r['rounds']} round(s) of
{r['duration_s']:g} s per configuration and level, interleaved; req/s and p99 are medians
over rounds; CPU is each process's over every measured run, per request (Envoy and the
bridge from /proc, Valkey from `INFO cpu`; the baselines touch neither the bridge nor
Valkey, whose numbers there are their idle cost).

{side_by_side.table(r)}
"""


def main():
    alone.run("rls", __doc__, measure, settings, section, smoke.check_rls, bridge_args)


if __name__ == "__main__":
    main()
