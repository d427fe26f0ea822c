"""What a hundred thousand clients' plans cost (docs/plans.md, "What plans cost"): the time
`ratelimit-bridge plan import` takes to write N plans, the time a running bridge takes to
apply them from the change log (its `ratelimit_bridge_plans` gauge reaching N), the time a
bridge started afterwards takes to read them whole, the bridge's resident memory before and
after (VmRSS), and Redis's memory for them (INFO memory's used_memory).

Standalone: `python3 -m bench.plans [--plans 100000]`; starts its own Valkey and bridge on
free ports (`make build` first) and prints one JSON object.
"""

import argparse
import json
import shutil
import subprocess
import tempfile
import time

from testbed.stack import BRIDGE, VALKEY, Process, free_port, redis_command, request, wait_for


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def plans_applied(port):
    """The bridge's `ratelimit_bridge_plans` gauge."""
    _, _, body = request(port, "/metrics", timeout=10)
    for line in body.splitlines():
        if line.startswith("ratelimit_bridge_plans "):
            return int(float(line.split()[1]))
    return 0


def start_bridge(workdir, redis_port, name):
    port = free_port()
    bridge = Process(name, [BRIDGE, "--listen", f"127.0.0.1:{port}", "--redis",
                            f"redis://127.0.0.1:{redis_port}", "--threads", "1"], workdir).start()
    wait_for(name, lambda: request(port, "/healthz", timeout=1)[0] == 200, proc=bridge.proc,
             log=bridge.log)
    return bridge, port


def until_applied(port, n, timeout=120.0):
    started = time.monotonic()
    while plans_applied(port) < n:
        assert time.monotonic() - started < timeout, f"{n} plans not applied in {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - started


def measure(n):
    workdir = tempfile.mkdtemp(prefix="ratelimit-bench-plans-")
    redis_port = free_port()
    valkey = Process("valkey", [VALKEY, "--port", str(redis_port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no"], workdir).start()
    bridges = []
    try:
        wait_for("valkey", lambda: redis_command(redis_port, "PING"), proc=valkey.proc)
        bridge, port = start_bridge(workdir, redis_port, "bridge")
        bridges.append(bridge)
        time.sleep(0.5)
        rss_before = rss_kib(bridge.proc.pid)
        redis_before = int(redis_command(redis_port, "INFO", "memory")["used_memory"])
        rows = "\n".join(json.dumps({"rule": "chat", "values": [f"customer-{i:07d}"],
                                     "plan": ("pro", "team", "enterprise")[i % 3],
                                     "requests": 1000 + i % 7, "per": "1m"})
                         for i in range(n))
        started = time.monotonic()
        done = subprocess.run([BRIDGE, "plan", "import", "-", "--redis",
                               f"redis://127.0.0.1:{redis_port}"], input=rows, text=True,
                              capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
        import_s = time.monotonic() - started
        imported = json.loads(done.stdout)
        assert imported["imported"] == n, imported
        follow_s = until_applied(port, n)
        time.sleep(0.5)
        rss_after = rss_kib(bridge.proc.pid)
        redis_after = int(redis_command(redis_port, "INFO", "memory")["used_memory"])
        # A bridge that starts with the plans in Redis reads them whole.
        fresh_started = time.monotonic()
        fresh, fresh_port = start_bridge(workdir, redis_port, "fresh")
        bridges.append(fresh)
        whole_s = until_applied(fresh_port, n)
        time.sleep(0.5)
        fresh_rss = rss_kib(fresh.proc.pid)
        return {
            "plans": n,
            "import_seconds": round(import_s, 3),
            "import_calls": imported["calls"],
            "applied_after_import_seconds": round(follow_s, 3),
            "whole_read_seconds_from_start": round(time.monotonic() - fresh_started, 3),
            "whole_read_seconds": round(whole_s, 3),
            "bridge_rss_mib_before": round(rss_before / 1024, 1),
            "bridge_rss_mib_after": round(rss_after / 1024, 1),
            "bridge_bytes_per_plan": round((rss_after - rss_before) * 1024 / n),
            "fresh_bridge_rss_mib": round(fresh_rss / 1024, 1),
            "redis_bytes_per_plan": round((redis_after - redis_before) / n),
        }
    finally:
        for b in bridges:
            b.stop()
        valkey.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=100_000)
    print(json.dumps(measure(parser.parse_args().plans), indent=2))


if __name__ == "__main__":
    main()
