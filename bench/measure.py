"""The measurements of `make bench`, each returning plain dicts for results.json:
configurations 1-7 through Envoy, Redis cost per check, bridge throughput, accuracy of
the limit across two gateways, and the wasm artifacts. Every process is a stack.Process
stopped in `finally`.
"""

import json
import os
import platform
import statistics
import subprocess
import time
import uuid
from pathlib import Path

import stack
import redis_cost
from cluster import ValkeyCluster
from envoys import LOADGEN, NOOP_WASM, WASM_FUEL, Gateway

CONCURRENCY = 16
USERS = 10_000
# The check's budget. Production's 25 ms default assumes the bridge on its own cores; here
# loadgen, Envoy, the bridge and Valkey share two, and a scheduling stall would turn into
# 503s that measure the machine, not the limiter.
TIMEOUT_MS = 250


def plugin(*rules, identity=None, max_inflight=0):
    """A plugin configuration whose rules are keyed by the `x-user-id` header by default."""
    return {
        "backend": {"cluster": "ratelimit_bridge", "timeout_ms": TIMEOUT_MS,
                    "max_inflight": max_inflight},
        "failure_mode": "closed",
        "key_prefix": "bench",
        "identity": {"user": {"header": "x-user-id"}, **(identity or {})},
        "rules": [{"key": ["user"], **rule} for rule in rules],
    }


UNLIMITED = {"requests": 1_000_000_000, "per": "1s"}
ONCE_A_DAY = {"requests": 1, "per": "1d"}

# (id, label, gateway kind, plugin, headers)
CONFIGS = [
    (1, "Envoy, no filter", "none", None, []),
    (2, "Envoy + no-op wasm", "noop", None, []),
    (3, "Envoy + local_ratelimit", "local", None, []),
    (4, "ratelimit.wasm, 1 key, allowed", "ratelimit",
     plugin({"name": "open", "limit": UNLIMITED}), ["x-user-id: bench"]),
    # Two rules per request: a bucket per user (10,000 of them, never empty) and a bucket
    # per tier, where tier t0 shares one bucket of one request a day: half the requests
    # are denied from the start, and a denied request takes no token from its user.
    (5, f"ratelimit.wasm, {USERS:,} keys, ~50% denied", "ratelimit",
     plugin({"name": "mixed", "limit": UNLIMITED},
            {"name": "tier", "key": ["tier"], "limit": UNLIMITED, "tiers": {"t0": ONCE_A_DAY}},
            identity={"tier": {"header": "x-tier"}}),
     [f"x-user-id: u{{n % {USERS}}}", "x-tier: t{n % 2}"]),
    (6, "ratelimit.wasm, 1 key, denied", "ratelimit",
     plugin({"name": "denied", "limit": ONCE_A_DAY}), ["x-user-id: bench"]),
    # Configuration 4 with callout coalescing: past 4 callouts in flight, the checks of a
    # millisecond share one callout.
    (7, "as 4, coalescing (max_inflight 4)", "ratelimit",
     plugin({"name": "coalesced", "limit": UNLIMITED}, max_inflight=4), ["x-user-id: bench"]),
]


def loadgen(workdir, name, urls, duration, concurrency=CONCURRENCY, warmup=0.0, headers=(),
            body=None, method="GET", rate=None, h2=False):
    """Runs bench's loadgen to completion; returns its JSON summary."""
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
    proc = stack.Process(name, argv, workdir).start()
    try:
        code = proc.proc.wait(timeout=warmup + duration + 60)
    finally:
        proc.stop()
    if code != 0 or not out.exists():
        raise RuntimeError(f"loadgen {name} failed ({code}):\n"
                           + Path(proc.log).read_text(errors="replace")[-2000:])
    return json.loads(out.read_text())


def configurations(bench, workdir, conf):
    """Configurations 1-7, `rounds` times in turn; each run after a warm-up."""
    gateways = []
    runs = {c[0]: [] for c in CONFIGS}
    counters = {}
    try:
        for cid, _, kind, plug, _ in CONFIGS:
            gateways.append(Gateway(f"envoy-config{cid}", kind, workdir, bench.bridge_port,
                                    plug).start())
        for rnd in range(conf["rounds"]):
            for (cid, label, _, _, headers), gw in zip(CONFIGS, gateways):
                result = loadgen(workdir, f"config{cid}-round{rnd}", [gw.url()],
                                 conf["duration"], warmup=conf["warmup"], headers=headers)
                runs[cid].append(result)
                print(f"  round {rnd + 1} config {cid}: {result['rps']:8.0f} rps  "
                      f"p99 {result['latency_us']['p99']:7.0f} us  {result['status']}", flush=True)
        counters = {cid: gw.counters() for (cid, *_), gw in zip(CONFIGS, gateways)}
    finally:
        for gw in gateways:
            gw.stop()
    return [{**summarise(cid, label, runs[cid]), "counters": counters.get(cid, {})}
            for cid, label, *_ in CONFIGS]


def summarise(cid, label, runs):
    """The median over rounds of each number, plus every run for the record."""
    def med(get):
        return statistics.median(get(r) for r in runs)
    status = {}
    for r in runs:
        for code, count in r["status"].items():
            status[code] = status.get(code, 0) + count
    return {
        "id": cid, "label": label,
        "rps": med(lambda r: r["rps"]),
        "p50": med(lambda r: r["latency_us"]["p50"]),
        "p99": med(lambda r: r["latency_us"]["p99"]),
        "p999": med(lambda r: r["latency_us"]["p999"]),
        "rps_runs": [r["rps"] for r in runs],
        "status": status,
        "errors": sum(r["errors"] for r in runs),
        "runs": runs,
    }


def overload(bench, workdir, conf, in_flight=128):
    """Configuration 4 with 8x the in-flight requests: what the callout timeout and
    `failure_mode: closed` do when the gateway is saturated."""
    _, label, kind, plug, headers = CONFIGS[3]
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
    line = f"bench:bridge:u{{n % {USERS}}},1000000000,1000000,1,1\n"
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
    line = f"bench:cl:a:u{{n % {USERS}}},1000000000,1000000,1,1 bench:cl:b:u{{n % {USERS}}},1000000000,1000000,1,1\n"
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
            clients = [redis_cost.Resp(p) for p in redis_ports]
            try:
                for c in clients:
                    c.call("CONFIG", "RESETSTAT")
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
    """One client at 2x its limit through two gateways: admitted vs what the limit allows."""
    results = []
    plug = plugin({"name": "accuracy", "limit": {"requests": limit, "per": "1s"}})
    for kind in ("ratelimit", "local"):
        gws = []
        try:
            for i in range(2):
                gws.append(Gateway(f"envoy-accuracy-{kind}-{i}", kind, workdir, bench.bridge_port,
                                   plug, local=(limit, limit)).start())
            user = f"acc-{uuid.uuid4().hex[:12]}"
            r = loadgen(workdir, f"accuracy-{kind}", [g.url() for g in gws],
                        conf["accuracy_duration"], concurrency=4, rate=2 * limit,
                        headers=[f"x-user-id: {user}"])
        finally:
            for g in gws:
                g.stop()
        admitted = r["status"].get("200", 0)
        expected = limit + limit * r["send_window_s"]  # a full bucket, then the refill
        results.append({"filter": kind, "limit_per_s": limit, "sent": r["responses"],
                        "window_s": r["send_window_s"], "admitted": admitted,
                        "expected": expected, "ratio": admitted / expected,
                        "status": r["status"], "errors": r["errors"]})
        print(f"  accuracy {kind}: admitted {admitted} / expected {expected:.0f}", flush=True)
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
    info = dict(line.split(":", 1) for line in
                (bench.redis("INFO", "server") + bench.redis("INFO", "memory")).splitlines()
                if ":" in line)
    valkey = (info.get("valkey_version") or info.get("redis_version") or "?").strip()
    valkey += f" ({info.get('mem_allocator', '?').strip()} allocator)"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(), "cpu": first("/proc/cpuinfo", "model name"),
        "memory": first("/proc/meminfo", "MemTotal"), "kernel": platform.release(),
        "envoy": version([stack.ENVOY, "--version"]).split("version:")[-1].strip(),
        "valkey": valkey, "rustc": version(["rustc", "--version"]),
        "python": platform.python_version(),
    }


def run_all(bench, workdir, conf):
    print("configurations 1-7", flush=True)
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
