#!/usr/bin/env python3
"""`make bench`: the performance report of ratelimit.wasm, side by side with its baselines.

Starts Valkey and the bridge through testbed/stack.py, one Envoy (`--concurrency 1`) per
configuration, drives each with bench's `loadgen` at 16 and 64 requests in flight, reads
the filter's counters and Valkey around every run, measures Redis, the bridge, the
accuracy of the limit, a fleet's cost per check (bench/fleet.py, on a Valkey, a Cluster
and bridges of its own), metering's cost on streamed responses (bench/streams.py) and
global rules across three regions (bench/regions.py), and Envoy's own ratelimit filter
with the bridge as its rate limit service (bench/rls.py) and the filter as a native dynamic
module (bench/module.py), then writes REPORT.md, results.json
and latency.svg to --out.
`--smoke` runs everything for a second or so and asserts the output is sane (and writes
to a temporary directory unless --out is given). Every process started here is a
stack.Process, stopped in `finally` on success, failure, Ctrl-C or SIGTERM.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from testbed import stack

from . import envoys, fleet, measure, module, regions, report, rls, smoke, streams


def settings(args):
    if args.smoke:
        return dict(rounds=1, duration=smoke.RUN_S, warmup=smoke.WARMUP_S, redis_checks=3000,
                    bridge_duration=smoke.RUN_S, accuracy_duration=2.0, fuel=False,
                    hot_rounds=1, hot_duration=smoke.RUN_S, **fleet.settings(short=True),
                    **streams.settings(short=True), **regions.settings(short=True),
                    **rls.settings(short=True), **module.settings(short=True))
    return dict(rounds=args.rounds, duration=args.duration, warmup=1.5, redis_checks=100_000,
                bridge_duration=8.0, accuracy_duration=10.0, fuel=True,
                hot_rounds=8, hot_duration=3.0, **fleet.settings(short=False),
                **streams.settings(short=False), **regions.settings(short=False),
                **rls.settings(short=False), **module.settings(short=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="half a second per configuration, assert sanity")
    parser.add_argument("--out", help="directory for REPORT.md, results.json, latency.svg")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over every configuration and in-flight level")
    parser.add_argument("--duration", type=float, default=6.0,
                        help="measured seconds per configuration and level")
    args = parser.parse_args()
    for path in (envoys.LOADGEN, envoys.SSE_UPSTREAM, envoys.NOOP_WASM):
        if not path.exists():
            sys.exit(f"{path} is missing: run `make bench` (it builds the bench crates)")
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (a background
    # job of a script); SIGTERM and SIGHUP exit through `finally` too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    temp_out = args.smoke and not args.out
    out = Path(args.out or (tempfile.mkdtemp(prefix="ratelimit-bench-smoke-") if temp_out
                            else Path(__file__).resolve().parent))
    out.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="ratelimit-bench-")
    conf = settings(args)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    ok = False
    bench_stack = stack.Stack(plugin={}, gateways=0, workdir=workdir,
                              bridge_args=rls.bridge_args(workdir))
    try:
        bench_stack.start()
        results = measure.run_all(bench_stack, workdir, conf)
        print("fleet: many streams, one check per exchange", flush=True)
        results["fleet"] = fleet.measure(workdir, conf)
        print("metering on streamed responses", flush=True)
        results["streams"] = streams.measure(bench_stack, workdir, conf)
        print("Envoy's own ratelimit filter, the bridge as its rate limit service", flush=True)
        results["rls"] = rls.measure(bench_stack, workdir, conf)
        print("the filter as a native dynamic module", flush=True)
        results["module"] = module.measure(bench_stack, workdir, conf)
        print("several regions, one limit", flush=True)
        results["regions"] = regions.measure(workdir, conf)
        results["bench_seconds"] = time.monotonic() - started
        results["machine"]["load"] = [load_before, os.getloadavg()[0]]
        results["settings"] = conf
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        report.write(out, results, smoke=args.smoke)
        if args.smoke:
            smoke.check(results, out)
        ok = True
    finally:
        bench_stack.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"bench failed; logs kept in {workdir}", file=sys.stderr)
    print(f"wrote {out / 'REPORT.md'} and {out / 'latency.svg'} "
          f"in {time.monotonic() - started:.0f} s")
    if args.smoke:
        print("smoke: ok")
    if temp_out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
