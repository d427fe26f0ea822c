"""The measurements of `make bench`, each returning plain dicts for results.json: the
Envoy configurations at 16 and 64 requests in flight, Redis cost per check, bridge
throughput, accuracy of the limit across two gateways, and the wasm artifacts. Every
process is a stack.Process stopped in `finally`.
"""

import json
import os
import platform
import resource
import statistics
import subprocess
import time
import uuid
from pathlib import Path

from testbed import stack
from testbed.cluster import ValkeyCluster

from . import redis_cost
from .diagnostics import Probe, add, derive
from .envoys import LOADGEN, NOOP_WASM, WASM_FUEL, Gateway

# Requests in flight of the comparison (loadgen --concurrency).
IN_FLIGHT = (16, 64)
USERS = 10_000
# The check's budget. Production's 25 ms default assumes the bridge on its own cores; here
# loadgen, Envoy, the bridge and Valkey share two, and a scheduling stall would turn into
# 503s that measure the machine, not the limiter.
TIMEOUT_MS = 250


def plugin(*rules, identity=None, transport=None):
    """A plugin configuration whose rules are keyed by the `x-user-id` header by default.
    The backend keeps the filter's defaults (gRPC stream, group commit) unless `transport`
    is given."""
    backend = {"cluster": "ratelimit_bridge", "timeout_ms": TIMEOUT_MS}
    if transport:
        backend["transport"] = transport
    return {
        "backend": backend,
        "failure_mode": "closed",
        "key_prefix": "rl",
        "identity": {"user": {"header": "x-user-id"}, **(identity or {})},
        "rules": [{"key": ["user"], **rule} for rule in rules],
    }


# The hot keys issue's configurations (a leased key, a denied key), held to the no-op's
# speed at this many requests in flight.
HOT_KEYS = ("leased", "denied")
HOT_KEYS_LEVEL = 16
# Run between no-op runs too, as the reference of the leased key: the headers floor.
BETWEEN_NOOPS = (*HOT_KEYS, "headers")

UNLIMITED = {"requests": 1_000_000_000, "per": "1s"}
# A worker's lease of a hot bucket: the bench's and the accuracy run's.
LEASE = {"tokens": 100, "ttl": "1s"}
ONCE_A_DAY = {"requests": 1, "per": "1d"}


def config(cid, key, label, kind, plug=None, headers=(), base="proxy"):
    """One configuration of the comparison; `key` names its role in the report."""
    rules = len(plug["rules"]) if plug else 0
    transport = None
    if plug:
        transport = plug["backend"].get("transport", "grpc")
    return {"id": cid, "key": key, "label": label, "kind": kind, "plugin": plug,
            "headers": list(headers), "base": base, "rules": rules, "transport": transport}


CONFIGS = [
    config("1", "none", "Envoy, no filter", "none"),
    config("2", "noop", "Envoy + no-op wasm", "noop"),
    config("3", "local", "Envoy + local_ratelimit", "local"),
    config("4", "floor", "callout floor: no-op wasm + 1 HTTP/2 callout", "floor"),
    # What any filter admitting without a callout and showing the limit pays at least.
    config("H", "headers", "headers floor: no-op wasm + the host calls of an allowed response",
           "headers", headers=["x-user-id: bench"]),
    config("5", "allowed", "ratelimit.wasm, 1 key, allowed", "ratelimit",
           plugin({"name": "open", "limit": UNLIMITED}), ["x-user-id: bench"]),
    # Two rules per request: a bucket per user (10,000 of them, never empty) and a bucket
    # per tier, where tier t0 shares one bucket of one request a day: half the requests
    # are denied from the start, and a denied request takes no token from its user.
    config("6", "mixed", f"ratelimit.wasm, {USERS:,} keys, ~50% denied", "ratelimit",
           plugin({"name": "mixed", "limit": UNLIMITED},
                  {"name": "tier", "key": ["tier"], "limit": UNLIMITED,
                   "tiers": {"t0": ONCE_A_DAY}},
                  identity={"tier": {"header": "x-tier", "trusted": True}}),
           [f"x-user-id: u{{n % {USERS}}}", "x-tier: t{n % 2}"]),
    config("7", "http", "ratelimit.wasm, 1 key, allowed, HTTP callouts", "ratelimit",
           plugin({"name": "open-http", "limit": UNLIMITED}, transport="http"),
           ["x-user-id: bench"]),
    # Answered by the deny cache after the first denial: no check until the day is over.
    config("8", "denied", "ratelimit.wasm, 1 key, denied", "ratelimit",
           plugin({"name": "denied", "limit": ONCE_A_DAY}), ["x-user-id: bench"]),
    config("9", "leased", f"ratelimit.wasm, 1 key, allowed, leases of {LEASE['tokens']}",
           "ratelimit", plugin({"name": "leased", "limit": UNLIMITED, "lease": LEASE}),
           ["x-user-id: bench"]),
    # The same baselines without an upstream: what earlier reports measured.
    config("D1", "direct-none", "Envoy, no filter (direct response)", "none", base="direct"),
    config("D2", "direct-noop", "Envoy + no-op wasm (direct response)", "noop", base="direct"),
]


def loadgen(workdir, name, urls, duration, concurrency=16, warmup=0.0, headers=(),
            body=None, method="GET", rate=None, h2=False, grpc=False, connections=1):
    """Runs bench's loadgen to completion; returns its JSON summary. `grpc`: every worker
    a gRPC stream to the bridge at `urls`, over `connections` h2c connections per URL."""
    out = Path(workdir) / f"{name}.json"
    argv = [str(LOADGEN), "--concurrency", str(concurrency), "--duration", str(duration),
            "--warmup", str(warmup), "--method", method, "--out", str(out)]
    for url in urls:
        argv += ["--url", url]
    for header in headers:
        argv += ["--header", header]
    if body is not None:
        argv += ["--body", body]
    if rate is not None:
        argv += ["--rate", str(rate)]
    if h2:
        argv.append("--h2")
    if grpc:
        argv.append("--grpc")
    if connections != 1:
        argv += ["--connections", str(connections)]
    before = children_cpu_seconds()
    proc = stack.Process(name, argv, workdir).start()
    try:
        code = proc.proc.wait(timeout=warmup + duration + 60)
    finally:
        proc.stop()
    if code != 0 or not out.exists():
        raise RuntimeError(f"loadgen {name} failed ({code}):\n"
                           + Path(proc.log).read_text(errors="replace")[-2000:])
    # The only child reaped meanwhile is this loadgen (servers run on): its own CPU, a
    # baseline of the same HTTP/2 and tokio work on the other end of every exchange.
    return {**json.loads(out.read_text()), "cpu_s": children_cpu_seconds() - before}


def children_cpu_seconds():
    """User + system CPU of this process's children that ended and were waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sent(result):
    return result["responses"] + result["errors"]


def measured_run(workdir, name, gw, probe, total, c, in_flight, conf):
    """A warm-up run, then the measured run; with a probe, the counters and Valkey
    statistics are read in between and after, and their delta (the measured run's) is
    added to `total`."""
    warm = loadgen(workdir, f"{name}-warmup", [gw.url()], conf["warmup"],
                   concurrency=in_flight, headers=c["headers"])
    if probe is None:
        return loadgen(workdir, name, [gw.url()], conf["duration"], concurrency=in_flight,
                       headers=c["headers"])
    probe.sent += sent(warm)
    before = probe.snapshot()
    result = loadgen(workdir, name, [gw.url()], conf["duration"], concurrency=in_flight,
                     headers=c["headers"])
    probe.sent += sent(result)
    add(total, before, probe.snapshot())
    return result


def configurations(bench, workdir, conf):
    """Every configuration at every in-flight level, `rounds` times in turn (rounds
    interleave the configurations, so a slow moment of the machine hits all of them)."""
    gateways, probes = {}, {}
    runs = {(c["id"], n): [] for c in CONFIGS for n in IN_FLIGHT}
    totals = {(c["id"], n): {} for c in CONFIGS for n in IN_FLIGHT}
    try:
        for c in CONFIGS:
            gw = Gateway(f"envoy-config{c['id']}", c["kind"], workdir, bench.bridge_port,
                         c["plugin"], base=c["base"])
            gateways[c["id"]] = gw.start()
            if c["kind"] == "ratelimit":
                probes[c["id"]] = Probe(gw, bench.redis_port)
        for rnd in range(conf["rounds"]):
            for n in IN_FLIGHT:
                for c in CONFIGS:
                    result = measured_run(workdir, f"config{c['id']}-c{n}-round{rnd}",
                                          gateways[c["id"]], probes.get(c["id"]),
                                          totals[(c["id"], n)], c, n, conf)
                    runs[(c["id"], n)].append(result)
                    print(f"  round {rnd + 1} {n:3} in flight config {c['id']:>2}: "
                          f"{result['rps']:8.0f} rps  p99 {result['latency_us']['p99']:7.0f} us"
                          f"  {result['status']}", flush=True)
        paired = between_noops(workdir, gateways, conf)
    finally:
        for probe in probes.values():
            probe.close()
        for gw in gateways.values():
            gw.stop()
    out = []
    for c in CONFIGS:
        levels = []
        for n in IN_FLIGHT:
            level = {"in_flight": n, **summarise(runs[(c["id"], n)])}
            if c["id"] in probes:
                total = totals[(c["id"], n)]
                level["counters"] = total
                level["diagnostics"] = derive(total, sum(sent(r) for r in level["runs"]),
                                              c["rules"])
            levels.append(level)
        out.append({**c, "levels": levels, **({"paired": paired[c["key"]]} if c["key"] in paired else {})})
    return out


def between_noops(workdir, gateways, conf):
    """The hot keys' configurations and the headers floor, each run right between two runs
    of the no-op filter (no-op, it, no-op; then the next) at HOT_KEYS_LEVEL in flight,
    `hot_rounds` times: a ratio per run, its req/s over the mean of its two neighbours'.
    In the rounds above a
    configuration runs up to a minute after the no-op, and the machine's speed drifts by
    more than these configurations differ from the no-op within that minute; neighbours a
    few seconds apart share its state, and a drift between them cancels out of the mean.
    Each triple has its own no-op runs: a first version shared them (no-op, leased, no-op,
    denied, no-op) and its median for the leased key read 0.99 where 20 triples of the
    leased key alone, the same day, read 0.90-0.93."""
    noop = by_key("noop")
    paired = {key: {"ratios": [], "rps": [], "status": {}} for key in BETWEEN_NOOPS}
    for rnd in range(conf["hot_rounds"]):
        for key in BETWEEN_NOOPS:
            c, rps = by_key(key), []
            for i, run in enumerate((noop, c, noop)):
                result = loadgen(workdir, f"paired-{rnd}-config{c['id']}-{i}",
                                 [gateways[run["id"]].url()], conf["hot_duration"],
                                 concurrency=HOT_KEYS_LEVEL, warmup=0.5, headers=run["headers"])
                rps.append(result["rps"])
                if run is c:
                    status = paired[key]["status"]
                    for code, count in result["status"].items():
                        status[code] = status.get(code, 0) + count
            ratio = rps[1] / ((rps[0] + rps[2]) / 2)
            paired[key]["ratios"].append(ratio)
            paired[key]["rps"].append(rps)
            print(f"  between no-ops, round {rnd + 1}: config {c['id']} x{ratio:.3f} of the "
                  f"no-op ({rps[0]:.0f}, {rps[1]:.0f}, {rps[2]:.0f} req/s)", flush=True)
    for result in paired.values():
        result["ratio"] = statistics.median(result["ratios"])
    return paired


def summarise(runs):
    """The median over rounds of each number, plus every run for the record."""
    def med(get):
        return statistics.median(get(r) for r in runs)
    status = {}
    for r in runs:
        for code, count in r["status"].items():
            status[code] = status.get(code, 0) + count
    return {
        "rps": med(lambda r: r["rps"]),
        "p50": med(lambda r: r["latency_us"]["p50"]),
        "p99": med(lambda r: r["latency_us"]["p99"]),
        "p999": med(lambda r: r["latency_us"]["p999"]),
        "rps_runs": [r["rps"] for r in runs],
        "status": status,
        "errors": sum(r["errors"] for r in runs),
        "runs": runs,
    }


def by_key(key):
    return next(c for c in CONFIGS if c["key"] == key)


def overload(bench, workdir, conf, in_flight=128):
    """'1 key, allowed' with 8x the in-flight requests: what the check timeout and
    `failure_mode: closed` do when the gateway is saturated."""
    c = by_key("allowed")
    label, kind, plug, headers = c["label"], c["kind"], c["plugin"], c["headers"]
    gw = Gateway("envoy-overload", kind, workdir, bench.bridge_port, plug)
    try:
        gw.start()
        r = loadgen(workdir, "overload", [gw.url()], conf["duration"], concurrency=in_flight,
                    warmup=conf["warmup"], headers=headers)
        counters = gw.counters()
    finally:
        gw.stop()
    print(f"  overload {in_flight} in flight: {r['rps']:8.0f} rps {r['status']}", flush=True)
    return {"in_flight": in_flight, "label": label, "rps": r["rps"], "p50": r["latency_us"]["p50"],
            "p99": r["latency_us"]["p99"], "p999": r["latency_us"]["p999"],
            "status": r["status"], "errors": r["errors"], "counters": counters}


def bridge_throughput(bench, workdir, conf):
    """Checks/s straight to the bridge over one h2c connection (as a gateway does)."""
    url = f"http://127.0.0.1:{bench.bridge_port}/v1/check"
    line = f"rl:bridge:u{{n % {USERS}}},1000000000,1000000,1,1\n"
    cases = [(16, 1), (64, 1), (16, 8)]
    results = []
    for in_flight, per_callout in cases:
        r = loadgen(workdir, f"bridge-{in_flight}x{per_callout}", [url], conf["bridge_duration"],
                    concurrency=in_flight, warmup=0.5, method="POST",
                    body=line * per_callout, h2=True)
        results.append({"in_flight": in_flight, "checks_per_callout": per_callout,
                        "callouts_per_s": r["rps"], "checks_per_s": r["rps"] * per_callout,
                        "p50": r["latency_us"]["p50"], "p99": r["latency_us"]["p99"],
                        "status": r["status"], "errors": r["errors"]})
        print(f"  bridge {in_flight} in flight x {per_callout}: "
              f"{r['rps'] * per_callout:8.0f} checks/s {r['status']}", flush=True)
    return results


def cluster_cost(bench, workdir, conf):
    """The same two-rule checks through the bridge against one Valkey and against a
    3-primary Valkey Cluster (where the two buckets of a check usually live on different
    slots: one script call each, in parallel): checks/s and Redis time per check."""
    line = f"rl:cl:a:u{{n % {USERS}}},1000000000,1000000,1,1 rl:cl:b:u{{n % {USERS}}},1000000000,1000000,1,1\n"
    results = []
    cluster, bridge = None, None
    try:
        cluster = ValkeyCluster(3).start()
        port = stack.free_port()
        bridge = stack.Process("bridge-cluster", [
            stack.BRIDGE, "--listen", f"127.0.0.1:{port}", "--cluster", "--redis", cluster.seeds(),
            "--threads", "1"], workdir).start()
        stack.wait_for("cluster bridge", lambda: stack.request(port, "/healthz", timeout=1)[0] == 200,
                       proc=bridge.proc, log=bridge.log)
        targets = [("1 Valkey", bench.bridge_port, [bench.redis_port]),
                   ("3-primary cluster", port, [p.port for p in cluster.primaries])]
        for label, bridge_port, redis_ports in targets:
            clients = [redis_cost.client(p) for p in redis_ports]
            try:
                for c in clients:
                    c.config_resetstat()
                cpu0 = sum(redis_cost.cpu_seconds(c.info("cpu")) for c in clients)
                r = loadgen(workdir, f"cluster-{len(redis_ports)}", [f"http://127.0.0.1:{bridge_port}/v1/check"],
                            conf["bridge_duration"], concurrency=16, warmup=0.0, method="POST",
                            body=line, h2=True)
                stats = [redis_cost.commandstats(c).get("evalsha", (0, 0)) for c in clients]
                cpu = sum(redis_cost.cpu_seconds(c.info("cpu")) for c in clients) - cpu0
            finally:
                for c in clients:
                    c.close()
            checks = max(1, r["status"].get("200", 0))
            calls, usec = sum(s[0] for s in stats), sum(s[1] for s in stats)
            results.append({"label": label, "checks_per_s": r["rps"], "script_calls_per_check": calls / checks,
                            "usec_per_check": usec / checks, "cpu_s_per_100k": cpu * 100_000 / checks,
                            "p99": r["latency_us"]["p99"], "status": r["status"]})
            print(f"  {label}: {r['rps']:8.0f} checks/s, {usec / checks:.1f} us/check", flush=True)
    finally:
        if bridge:
            bridge.stop()
        if cluster:
            cluster.close()
    return results


def accuracy(bench, workdir, conf, limit=100):
    """One client at 2x its limit through two gateways: admitted vs what the limit allows,
    exactly checked, with leases of 5 tokens, and by Envoy's local_ratelimit."""
    results = []
    per_second = {"requests": limit, "per": "1s"}
    plugins = {"ratelimit": plugin({"name": "accuracy", "limit": per_second}),
               "leased": plugin({"name": "accuracy-leased", "limit": per_second,
                                 "lease": {"tokens": 5, "ttl": "1s"}}),
               "local": None}
    for filt, plug in plugins.items():
        kind = "local" if filt == "local" else "ratelimit"
        gws = []
        try:
            for i in range(2):
                gws.append(Gateway(f"envoy-accuracy-{filt}-{i}", kind, workdir, bench.bridge_port,
                                   plug, local=(limit, limit)).start())
            user = f"acc-{uuid.uuid4().hex[:12]}"
            r = loadgen(workdir, f"accuracy-{filt}", [g.url() for g in gws],
                        conf["accuracy_duration"], concurrency=4, rate=2 * limit,
                        headers=[f"x-user-id: {user}"])
        finally:
            for g in gws:
                g.stop()
        admitted = r["status"].get("200", 0)
        expected = limit + limit * r["send_window_s"]  # a full bucket, then the refill
        results.append({"filter": filt, "limit_per_s": limit, "sent": r["responses"],
                        "window_s": r["send_window_s"], "admitted": admitted,
                        "expected": expected, "ratio": admitted / expected,
                        "status": r["status"], "errors": r["errors"]})
        print(f"  accuracy {filt}: admitted {admitted} / expected {expected:.0f}", flush=True)
    return results


def wasm_info(workdir, fuel=True):
    """Sizes, and fuel per request from bench/fuel's `wasm-fuel` (wasmtime harness) when
    it built; otherwise why not. It compiles the filter in a debug build of wasmtime
    (~20 s), so the smoke run skips it."""
    sizes = {"ratelimit.wasm": os.path.getsize(stack.WASM), "noop": os.path.getsize(NOOP_WASM)}
    if not fuel:
        return {"sizes": sizes, "fuel": None, "fuel_missing": "skipped in the smoke run"}
    if not WASM_FUEL.exists():
        return {"sizes": sizes, "fuel": None, "fuel_missing": f"{WASM_FUEL} was not built"}
    proc = stack.Process("wasm-fuel", [str(WASM_FUEL), stack.WASM, str(NOOP_WASM)],
                         workdir).start()
    try:
        code = proc.proc.wait(timeout=120)
    finally:
        proc.stop()
    lines = Path(proc.log).read_text(errors="replace").strip().splitlines()
    if code != 0 or not lines:
        return {"sizes": sizes, "fuel": None,
                "fuel_missing": f"wasm-fuel failed: {' / '.join(lines[-3:])}"}
    return {"sizes": sizes, "fuel": json.loads(lines[-1])}


def machine(bench):
    def first(path, key):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
        return "?"
    def version(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return "?"
    info = {**bench.redis("INFO", "server"), **bench.redis("INFO", "memory")}
    valkey = str(info.get("valkey_version") or info.get("redis_version") or "?")
    valkey += f" ({info.get('mem_allocator', '?')} allocator)"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(), "cpu": first("/proc/cpuinfo", "model name"),
        "memory": first("/proc/meminfo", "MemTotal"), "kernel": platform.release(),
        "envoy": version([stack.ENVOY, "--version"]).split("version:")[-1].strip(),
        "valkey": valkey, "rustc": version(["rustc", "--version"]),
        "python": platform.python_version(),
    }


def run_all(bench, workdir, conf):
    print(f"configurations at {' and '.join(map(str, IN_FLIGHT))} in flight", flush=True)
    results = {"configs": configurations(bench, workdir, conf)}
    print("overload", flush=True)
    results["overload"] = overload(bench, workdir, conf)
    print("redis cost per check", flush=True)
    results["redis"] = redis_cost.measure(bench.redis_port, conf["redis_checks"])
    print("bridge throughput", flush=True)
    results["bridge"] = bridge_throughput(bench, workdir, conf)
    print("one Valkey vs a 3-primary cluster", flush=True)
    results["cluster"] = cluster_cost(bench, workdir, conf)
    print("accuracy", flush=True)
    results["accuracy"] = accuracy(bench, workdir, conf)
    print("wasm", flush=True)
    results["wasm"] = wasm_info(workdir, conf["fuel"])
    results["machine"] = machine(bench)
    return results
