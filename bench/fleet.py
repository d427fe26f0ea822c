"""The fleet section of `make bench`: what the bridge and Redis spend per check when a fleet
of gateway workers each sends one check at a time, the case group commit in the bridge is
for (issue 21, item 4).

A fleet of 1M req/s over 800 workers is ~1,250 req/s per worker: each worker's exchanges
carry one check, and only the bridge, which sees every worker, can batch them. `loadgen
--grpc` plays those workers: 256 long-lived gRPC streams over 16 h2c connections, each
exchange one check of two rules (a user of 100,000, an IP of 33,000, every check allowed).
It drives a bridge on one Valkey and a bridge on a 3-primary Valkey Cluster, each in a
closed loop with exchanges of 1 check and of 8 (for comparison), and in an open loop at
half the closed loop's rate (for latency); then one run through the real filter, an Envoy
with 4 workers and a plugin of the same two rules. Per run: checks/s, script calls per
check (`INFO commandstats`, summed over the primaries, `CONFIG RESETSTAT` before), the
batch the bridge formed (checks per script call; its /metrics batch histogram when it
serves one), Redis CPU (`INFO cpu`) and bridge CPU (/proc) per check, errors, p50/p99.

Standalone: `.venv/bin/python -m bench.fleet [--smoke] [--out DIR]` (after `make
bench-build`): prints the table, writes fleet.json to DIR. Every process is a
stack.Process (through testbed's Stack and ValkeyCluster), stopped in `finally`.
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testbed import stack
from testbed.cluster import ValkeyCluster

from . import redis_cost, smoke
from .cells import ms, num
from .diagnostics import SCRIPT_COMMANDS, Probe, add, derive, process_cpu_seconds
from .envoys import Gateway
from .measure import UNLIMITED, loadgen, plugin

STREAMS, CONNECTIONS = 256, 16
USERS, IPS = 100_000, 33_000
# Checks per exchange: a fleet's normal case, and a batch formed upstream for comparison.
EXCHANGES = (1, 8)
RULES = 2
# Never empty in a run: every check is allowed and charged. A token refills in an hour, so
# no bucket is full (its key expired) before the section ends: with a token a second, the
# keys the closed loops wrote expired together during the next runs, and Valkey's expiry
# cycle then held its one thread for 25-67 ms at a time (`LATENCY LATEST`), which showed as
# the bridge's p99 at modest load (3-4 ms, against 1.1 ms without it) and as Redis CPU of
# runs that did not write those keys.
BUCKET = "1000000,1,3600000,1"
CHECK = f"rl:fleet-user:u{{n % {USERS}}},{BUCKET} rl:fleet-ip:ip{{n % {IPS}}},{BUCKET}"
# The bridges' bound on a Redis command. The default (1 s) is for Redis on cores of its
# own; here 2,048 checks in flight (256 streams of 8) on a Cluster sharing two cores with
# everything queue past it ("! redis: timed out" on ~1% of the checks of a loaded run),
# and the queueing should show as latency, not as failed checks.
REDIS_TIMEOUT_MS = 5000
# The open loop's rate, against the closed loop's exchanges of one check.
OPEN_LOOP_SHARE = 0.5
# A modest load: a bridge that is not short of CPU, for the latency it adds.
MODEST_RATE = 2000
# Through Envoy: 4 workers (4 streams to the bridge), requests in flight.
ENVOY_WORKERS, ENVOY_IN_FLIGHT = 4, 64
# loadgen has one source address, so the IP comes from X-Forwarded-For: 129 x 256 =
# 33,024 addresses (coprime moduli).
ENVOY_HEADERS = (f"x-user-id: u{{n % {USERS}}}", "x-forwarded-for: 10.0.{n % 129}.{n % 256}")
ENVOY_PLUGIN = plugin({"name": "fleet-user", "limit": UNLIMITED},
                      {"name": "fleet-ip", "key": ["ip"], "limit": UNLIMITED},
                      identity={"ip": {"source": "xff", "trusted_hops": 1}})


def settings(short):
    """The section's settings in run.py's: `short` for the smoke run (~15 s in all; the
    full section takes about 70 s)."""
    return dict(fleet_duration=smoke.RUN_S, fleet_warmup=smoke.WARMUP_S) if short else \
        dict(fleet_duration=8.0, fleet_warmup=2.0)


def batch_metrics(port):
    """The histograms of the bridge's /metrics about batches and exchanges, {family:
    {sample: value}}; None when it does not serve /metrics."""
    try:
        status, _, body = stack.request(port, "/metrics", timeout=2)
    except OSError:
        return None
    if status != 200:
        return None
    return {family.name: {sample_key(s): s.value for s in family.samples}
            for family in text_string_to_metric_families(body)
            if family.type == "histogram" and ("batch" in family.name or "exchange" in family.name)}


def sample_key(sample):
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}" if labels else sample.name


def histograms(before, after):
    """Each batch histogram's count, mean and buckets over a run, from two /metrics
    readings; None when the bridge serves none."""
    if after is None:
        return None
    out = {}
    for family, samples in after.items():
        old = (before or {}).get(family, {})
        delta = {k: v - old.get(k, 0) for k, v in samples.items()}
        total = sum(v for k, v in delta.items() if k.split("{")[0].endswith("_sum"))
        count = sum(v for k, v in delta.items() if k.split("{")[0].endswith("_count"))
        buckets = {k: v for k, v in delta.items() if k.split("{")[0].endswith("_bucket")}
        out[family] = {"count": count, "mean": total / count if count else None,
                       "buckets": buckets}
    return out


def upper_quantile(histogram, q):
    """The bound of the first bucket holding the `q` quantile of a histogram's
    observations over a run (an upper bound of that quantile); None without any."""
    if not histogram or not histogram["count"]:
        return None
    bounds = sorted((float(k.split('le="')[1].split('"')[0]), v)
                    for k, v in histogram["buckets"].items() if 'le="' in k)
    return next((le for le, n in bounds if n >= q * histogram["count"]), None)


class Backend:
    """A bridge and the primaries it runs the script on, read around every run."""

    def __init__(self, label, bridge_stack, redis_ports):
        self.label, self.stack = label, bridge_stack
        self.url = f"http://127.0.0.1:{bridge_stack.bridge_port}"
        self.clients = [redis_cost.client(p) for p in redis_ports]

    def reset(self):
        for c in self.clients:
            c.config_resetstat()

    def snapshot(self):
        stats = [redis_cost.commandstats(c) for c in self.clients]
        calls = sum(s.get(cmd, (0, 0))[0] for s in stats for cmd in SCRIPT_COMMANDS)
        return {"script_calls": calls,
                "redis_cpu_s": sum(redis_cost.cpu_seconds(c.info("cpu")) for c in self.clients),
                "bridge_cpu_s": process_cpu_seconds(self.stack.bridge.proc.pid),
                "metrics": batch_metrics(self.stack.bridge_port)}

    def close(self):
        for c in self.clients:
            c.close()


def costs(before, after, checks):
    """Per-check costs between two snapshots of a run that answered `checks` checks."""
    per = max(1, checks)
    calls = after["script_calls"] - before["script_calls"]
    redis_us = (after["redis_cpu_s"] - before["redis_cpu_s"]) * 1e6
    bridge_us = (after["bridge_cpu_s"] - before["bridge_cpu_s"]) * 1e6
    return {"checks": checks, "script_calls": calls, "script_calls_per_check": calls / per,
            "batch_size": checks / calls if calls else None,
            "redis_cpu_us_per_check": redis_us / per,
            "redis_cpu_us_per_rule_check": redis_us / (per * RULES),
            "bridge_cpu_us_per_check": bridge_us / per,
            **in_bridge(histograms(before["metrics"], after["metrics"]))}


def against_loadgen(result, checks):
    """The load generator's CPU per check: the other end of the same exchanges on the same
    HTTP/2 and tokio stack, so the bridge's CPU in its units (`table`) moves far less with
    the machine's speed (which varied twofold within an hour here) than either figure."""
    loadgen_us = result["cpu_s"] * 1e6 / max(1, checks)
    return {"loadgen_cpu_us_per_check": loadgen_us}


def in_bridge(hists):
    """The batch histograms, and the p99 of an exchange's time in the bridge (Redis
    included) from its own histogram, in ms."""
    hists = hists or {}
    exchange = hists.pop("ratelimit_bridge_exchange_seconds", None)
    p99 = upper_quantile(exchange, 0.99)
    return {"bridge_batches": hists or None,
            "bridge_p99_ms": None if p99 is None else p99 * 1000}


def show(what, row):
    print(f"  {what}: {row['checks_per_s']:7.0f} checks/s, "
          f"{row['script_calls_per_check']:.2f} script calls, Redis "
          f"{row['redis_cpu_us_per_check']:.0f} us, bridge {row['bridge_cpu_us_per_check']:.0f} us "
          f"per check, p99 {row['p99'] / 1000:.2f} ms, {row['errors']} errors", flush=True)


def stream_run(backend, workdir, conf, name, checks_per_exchange, rate=None):
    """One measured loadgen --grpc run against the backend's bridge, with its costs."""
    backend.reset()
    before = backend.snapshot()
    r = loadgen(workdir, name, [backend.url], conf["fleet_duration"], concurrency=STREAMS,
                body="\n".join([CHECK] * checks_per_exchange), rate=rate, grpc=True,
                connections=CONNECTIONS)
    load = "closed loop" if rate is None else f"open loop, {rate:.0f}/s"
    row = {"redis": backend.label, "load": load, "checks_per_exchange": checks_per_exchange,
           "rate": rate, "exchanges_per_s": r["rps"], "checks_per_s": r["grpc"]["checks_per_s"],
           "failed_checks": r["grpc"]["failed_checks"], "errors": r["errors"],
           "p50": r["latency_us"]["p50"], "p99": r["latency_us"]["p99"],
           **costs(before, backend.snapshot(), r["grpc"]["checks"]),
           **against_loadgen(r, r["grpc"]["checks"])}
    show(f"{backend.label}, {load}, {checks_per_exchange} per exchange", row)
    return row


def set_cost(client, commands=30_000, rounds=3):
    """Valkey CPU µs per plain `SET`, pipelined, the median of `rounds`: the baseline of
    Redis's per-rule cost in the same run (the same server binary, on the machine as fast
    as it is now)."""
    costs = []
    for _ in range(rounds):
        # On an empty server: buckets of earlier runs expiring meanwhile would count.
        client.execute_command("FLUSHALL")
        before = redis_cost.cpu_seconds(client.info("cpu"))
        for start in range(0, commands, 1000):
            redis_cost.pipeline(client, [("SET", f"fleet-baseline:{i}", "x")
                                         for i in range(start, start + 1000)])
        costs.append((redis_cost.cpu_seconds(client.info("cpu")) - before) * 1e6 / commands)
    client.execute_command("FLUSHALL")
    return statistics.median(costs)


def stream_runs(backend, workdir, conf, baseline):
    """The backend's runs: a warm-up, closed loops of each exchange size, the open loop;
    each row with the `SET` cost measured on `baseline` (a Valkey client) just before."""
    set_us = set_cost(baseline)
    tag = backend.label.replace(" ", "-").lower()
    loadgen(workdir, f"fleet-{tag}-warmup", [backend.url], conf["fleet_warmup"],
            concurrency=STREAMS, body="\n".join([CHECK] * max(EXCHANGES)), grpc=True,
            connections=CONNECTIONS)
    rows = [stream_run(backend, workdir, conf, f"fleet-{tag}-closed-{k}", k) for k in EXCHANGES]
    rate = OPEN_LOOP_SHARE * rows[0]["exchanges_per_s"]
    rows.append(stream_run(backend, workdir, conf, f"fleet-{tag}-open-1", 1, max(1.0, rate)))
    rows.append(stream_run(backend, workdir, conf, f"fleet-{tag}-modest-1", 1, MODEST_RATE))
    for row in rows:
        row["redis_set_us"] = set_us
    return rows


def through_envoy(backend, workdir, conf):
    """The same two rules through the real filter: Envoy with 4 workers, each holding a
    gRPC stream to the bridge with group commit; costs per request."""
    gw = Gateway("envoy-fleet", "ratelimit", workdir, backend.stack.bridge_port, ENVOY_PLUGIN,
                 concurrency=ENVOY_WORKERS)
    probe = Probe(gw, backend.stack.redis_port)
    try:
        gw.start()
        warm = loadgen(workdir, "fleet-envoy-warmup", [gw.url()], conf["fleet_warmup"],
                       concurrency=ENVOY_IN_FLIGHT, headers=ENVOY_HEADERS)
        probe.sent += warm["responses"] + warm["errors"]
        backend.reset()
        counters, before = probe.snapshot(), backend.snapshot()
        r = loadgen(workdir, "fleet-envoy", [gw.url()], conf["fleet_duration"],
                    concurrency=ENVOY_IN_FLIGHT, headers=ENVOY_HEADERS)
        probe.sent += r["responses"] + r["errors"]
        after, delta = backend.snapshot(), {}
        add(delta, counters, probe.snapshot())
    finally:
        probe.close()
        gw.stop()
    ok = r["status"].get("200", 0)
    row = {"redis": backend.label, "load": f"Envoy --concurrency {ENVOY_WORKERS}, "
                                          f"{ENVOY_IN_FLIGHT} requests in flight",
           "checks_per_exchange": None, "rate": None, "exchanges_per_s": None,
           "checks_per_s": r["rps"], "status": r["status"], "failed_checks": r["responses"] - ok,
           "errors": r["errors"] + r["responses"] - ok,
           "p50": r["latency_us"]["p50"], "p99": r["latency_us"]["p99"],
           "filter": derive(delta, r["responses"], RULES), **costs(before, after, ok)}
    d = row["filter"]
    row["checks_per_exchange"] = d["checks_per_exchange"]
    show(f"through Envoy (a check per request), {r['status']}", row)
    return row


def measure(workdir, conf):
    """Every run of the section; returns the results' "fleet" entry."""
    workdir = Path(workdir) / "fleet"
    workdir.mkdir(parents=True, exist_ok=True)
    out = {"streams": STREAMS, "connections": CONNECTIONS, "users": USERS, "ips": IPS,
           "rules_per_check": RULES, "duration_s": conf["fleet_duration"], "runs": []}
    started = time.monotonic()
    stacks, backends, cluster = [], [], None

    def bridge(label, name, ports=None, on=None):
        """A bridge (`--threads 1`, as the bench's) on a Valkey of its own or on `on`."""
        (workdir / name).mkdir(exist_ok=True)
        stacks.append(stack.Stack(plugin={}, gateways=0, workdir=str(workdir / name),
                                  cluster=on,
                                  bridge_args=["--redis-timeout-ms", str(REDIS_TIMEOUT_MS)]))
        stacks[-1].start()
        backends.append(Backend(label, stacks[-1], ports or [stacks[-1].redis_port]))
        return backends[-1]

    try:
        single = bridge("1 Valkey", "single")
        # Valkey's cost of a plain SET is measured on this server before either backend's
        # runs, as the Redis figures' baseline.
        out["runs"] += stream_runs(single, str(workdir), conf, single.clients[0])
        out["envoy"] = through_envoy(single, str(workdir), conf)
        cluster = ValkeyCluster(3).start()
        clustered = bridge("3-primary cluster", "cluster", [p.port for p in cluster.primaries],
                           on=cluster)
        out["runs"] += stream_runs(clustered, str(workdir), conf, single.clients[0])
    finally:
        for b in backends:
            b.close()
        for s in stacks:
            s.close()
        if cluster:
            cluster.close()
    out["seconds"] = time.monotonic() - started
    return out


def ratio(value, unit):
    return value / unit if unit else None


def table(fleet):
    """The section's table: one row per run, the Envoy run last."""
    rows = ["| checks per exchange | Redis | load | checks/s | script calls per check | "
            "Redis CPU µs per check | per rule-check | per rule-check in SETs | "
            "bridge CPU µs per check | in loadgen's | batch size "
            "(checks per call) | bridge batch histogram (mean) | p50 ms | p99 ms | "
            "p99 in the bridge ms (≤) | errors |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in [*fleet["runs"], *([fleet["envoy"]] if fleet.get("envoy") else [])]:
        hist = r["bridge_batches"]
        means = ", ".join(f"{name}: {num(h['mean'], '.2f')}" for name, h in hist.items()) \
            if hist else "not served"
        rows.append(
            f"| {num(r['checks_per_exchange'], '.2f' if 'filter' in r else 'd')} | {r['redis']} | "
            f"{r['load']} | {r['checks_per_s']:.0f} | {num(r['script_calls_per_check'], '.3f')} | "
            f"{r['redis_cpu_us_per_check']:.1f} | {r['redis_cpu_us_per_rule_check']:.1f} | "
            f"{num(ratio(r['redis_cpu_us_per_rule_check'], r.get('redis_set_us')), '.1f')} | "
            f"{r['bridge_cpu_us_per_check']:.1f} | "
            f"{num(ratio(r['bridge_cpu_us_per_check'], r.get('loadgen_cpu_us_per_check')), '.2f')} | "
            f"{num(r['batch_size'], '.2f')} | "
            f"{means or 'none'} | "
            f"{ms(r['p50'])} | {ms(r['p99'])} | "
            f"{num(r.get('bridge_p99_ms'), '.2f')} | {r['errors']} |")
    return "\n".join(rows)


def section(fleet):
    """The "Fleet" section of REPORT.md."""
    f = fleet
    return f"""## Fleet: many gateway workers, one check per exchange

`loadgen --grpc` plays the workers of a fleet of gateways: {f['streams']} long-lived gRPC
streams (`/ratelimit.v1.Bridge/Check`) over {f['connections']} h2c connections to one bridge
(`--threads 1`, `--redis-timeout-ms {REDIS_TIMEOUT_MS}` so that queueing on this machine
shows as latency rather than failed checks), each stream one exchange at a time. A check has {f['rules_per_check']} rules,
a user of {f['users']:,} and an IP of {f['ips']:,}, and is always allowed. Per Redis: a
warm-up, then {f['duration_s']:g} s closed loops with exchanges of 1 check (a fleet's normal
case, which only the bridge can batch) and of 8, then an open loop of 1-check exchanges at
{OPEN_LOOP_SHARE:g}× the closed loop's rate and one at a modest {MODEST_RATE:,}/s (a bridge
that is not short of CPU), for the latency. Last row: the same two rules
through the real filter (Envoy `--concurrency {ENVOY_WORKERS}`, a stream and group commit
per worker, the IP from `X-Forwarded-For`), a check per request; its "checks per exchange"
is the filter's `checks_sent` per stream message.

{table(fleet)}

- **script calls per check**: `INFO commandstats` (`EVALSHA`, `EVAL`, `FCALL`) summed over
  the primaries after `CONFIG RESETSTAT`, per answered check; **batch size** is its
  inverse, the checks per script call the bridge formed. **bridge batch histogram**: the
  mean of each histogram about batches on the bridge's `/metrics`, when it serves one.
- **Redis CPU**: `used_cpu_sys + used_cpu_user` summed over the primaries; **bridge
  CPU**: `utime + stime` of the bridge process; deltas over the run per answered check
  (per rule-check: divided by {f['rules_per_check']} more).
- **Baselines side by side**, as this machine's speed varies (twofold within an hour, both
  figures above moving together): **in SETs** is the Redis CPU per rule-check over
  Valkey's CPU per plain pipelined `SET`, measured on the one Valkey (empty, the same
  binary as the Cluster's nodes) just before each backend's runs; **in loadgen's** is the bridge's CPU per check over the load
  generator's (its `getrusage`), which does the other end of the same HTTP/2 exchanges on
  the same tokio stack.
- **p50 / p99**: per exchange (per request through Envoy), as the load generator saw it.
  Everything shares this machine's two cores with it. **p99 in the bridge**: from the
  bridge's `exchange_seconds` histogram, an exchange read to answered (Redis included):
  the bound of the bucket holding the 99th percentile.
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="half a second per run, assert sanity")
    parser.add_argument("--out", help="directory for fleet.json")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="ratelimit-fleet-")
    ok = False
    try:
        fleet = measure(workdir, settings(short=args.smoke))
        print(table(fleet))
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "fleet.json").write_text(json.dumps(fleet, indent=2) + "\n")
        if args.smoke:
            smoke.check_fleet(fleet)
            print("smoke: ok")
        ok = True
    finally:
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"fleet failed; logs kept in {workdir}")


if __name__ == "__main__":
    main()
