"""Where Envoy's CPU goes with the native module: every microsecond of a request accounted
for, by perf (`make profile`; the breakdown in docs/capacity.md comes from it).

For each case (Envoy alone, Envoy's `local_ratelimit` allowing and denying, the module's
exact, leased and denied checks, as bench/module.py runs them: one worker, 100,000 users or one hot user,
closed loop), two runs of the same load: one measures Envoy's CPU per request from /proc,
the other samples Envoy with `perf record --call-graph dwarf` (which slows what it
watches, so it gives the shares alone). Each sample is put where its stack says:

- the thread: a worker, or the main thread (which holds the module's streams to the
  bridge: `dynmod/src/streams.rs`);
- the module's hook it is under (`envoy_dynamic_module_on_*`), if any;
- under a hook, the innermost of Envoy's callbacks the module called
  (`envoy_dynamic_module_callback_*`: header reads and writes, counters, the scheduler,
  callouts), or the module's own code (its innermost function, which the C library's
  functions it calls are counted in);
- under no hook, Envoy's own work (its codec, router, connections; the module's share of
  it shows as the difference from Envoy alone).

Envoy's binary is stripped but exports its callbacks, so they are named; the module is
built with its symbols (target/profile/). Needs `perf` and a kernel that lets this user
sample its own processes (perf_event_paranoid <= 2).

Standalone: `.venv/bin/python -m bench.profile [--seconds 5] [--out FILE]` after
`make profile`'s builds.
"""

import argparse
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from testbed import stack

from . import alone
from .diagnostics import process_cpu_seconds
from .envoys import Gateway
from .measure import LEASE, ONCE_A_DAY, UNLIMITED, loadgen, plugin
from .side_by_side import HEADERS

IN_FLIGHT = 64
# (key, label, gateway kind, plugin, request headers, local_ratelimit's (rate, burst)).
NEVER = (10**6, 10**6)
CASES = [
    ("none", "Envoy, no filter", "none", None, HEADERS, NEVER),
    ("local", "Envoy's local_ratelimit, allowing", "local", None, HEADERS, NEVER),
    ("local-denied", "Envoy's local_ratelimit, denying", "local", None, HEADERS, (1, 1)),
    ("exact", "module, exact check (100k users)", "module",
     plugin({"name": "exact", "limit": UNLIMITED}), HEADERS, NEVER),
    ("leased", "module, leased (one hot user)", "module",
     plugin({"name": "leased", "limit": UNLIMITED, "lease": LEASE}), ["x-user-id: hot"], NEVER),
    ("denied", "module, denied (deny cache)", "module",
     plugin({"name": "denied", "limit": ONCE_A_DAY}), ["x-user-id: done"], NEVER),
]
HOOK, CALLBACK = "envoy_dynamic_module_on_", "envoy_dynamic_module_callback_"
MODULE_SO = "libratelimit.so"
# The module's release build with its symbols (`make profile`).
MODULE_DIR = stack.ROOT / "target" / "profile" / "module"


def place(comm, frames):
    """Where one sample goes: (thread, hook, what), from its frames (symbol, object),
    innermost first."""
    thread = "main" if comm == "envoy" else "worker" if comm.startswith("wrk:") else comm
    hooks = [sym for sym, dso in frames if sym.startswith(HOOK) and dso.endswith(MODULE_SO)]
    if not hooks:
        return thread, "-", "Envoy's own work"
    hook = hooks[-1].removeprefix(HOOK)
    callback = next((sym for sym, _ in frames if sym.startswith(CALLBACK)), None)
    if callback:
        return thread, hook, "callback " + callback.removeprefix(CALLBACK)
    inner = next(sym for sym, dso in frames if dso.endswith(MODULE_SO))
    return thread, hook, "module: " + short(inner)


def short(symbol):
    """A Rust symbol without its hash and generics' noise, at most its last three paths."""
    symbol = re.sub(r"::h[0-9a-f]{16}$", "", symbol)
    symbol = re.sub(r"<[^<>]*>", "<>", re.sub(r"<[^<>]*>", "<>", symbol))
    return "::".join(symbol.split("::")[-3:])


def samples(script_output):
    """(comm, frames) of each sample of `perf script`'s output (a header line, then one
    indented line per frame: address, symbol+offset, (object))."""
    comm, frames = None, []
    for line in script_output.splitlines():
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif not line[0].isspace():
            comm, frames = line.split()[0], []
        else:
            parts = line.split(None, 1)
            rest = parts[1] if len(parts) > 1 else ""
            sym, _, dso = rest.rpartition(" (")
            frames.append((sym.rsplit("+0x", 1)[0], dso.rstrip(")")))
    if comm is not None:
        yield comm, frames


def record(pid, seconds, out):
    """perf's samples of process `pid` for `seconds`, with their stacks, into `out`."""
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "997", "--call-graph",
                    "dwarf,16384", "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)],
                   check=True, capture_output=True)


def shares(perf_data):
    """{(thread, hook, what): share of the samples}."""
    text = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "comm,ip,sym,dso"],
                          check=True, capture_output=True, text=True).stdout
    counts = Counter(place(comm, frames) for comm, frames in samples(text))
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in counts.items()}


def measure_case(bench, workdir, case, seconds):
    key, label, kind, plug, headers, local = case
    gw = Gateway(f"envoy-{key}", kind, workdir, bench.bridge_port, plug, local=local).start()
    try:
        pid = gw.process.proc.pid
        url = [gw.url()]
        loadgen(workdir, f"{key}-warm", url, 1.0, concurrency=IN_FLIGHT, headers=headers)
        before = process_cpu_seconds(pid)
        plain = loadgen(workdir, f"{key}-cpu", url, seconds, concurrency=IN_FLIGHT,
                        headers=headers)
        cpu_us = (process_cpu_seconds(pid) - before) * 1e6 / max(1, plain["responses"])
        perf_data = Path(workdir) / f"{key}.perf"
        recorder = threading.Thread(target=record, args=(pid, seconds, perf_data))
        loading = threading.Thread(target=loadgen, args=(
            workdir, f"{key}-perf", url, seconds + 1.0),
            kwargs={"concurrency": IN_FLIGHT, "headers": headers, "warmup": 0.5})
        loading.start()
        time.sleep(0.5)
        recorder.start()
        recorder.join()
        loading.join()
        return {"key": key, "label": label, "rps": plain["rps"], "status": plain["status"],
                "envoy_cpu_us": cpu_us, "shares": shares(perf_data)}
    finally:
        gw.stop()


def table(results):
    """The breakdown as markdown: per case, µs of Envoy's CPU per request by place."""
    lines = []
    base = results[0]["envoy_cpu_us"]
    for r in results:
        lines.append(f"\n**{r['label']}**: {r['rps']:.0f} req/s, Envoy {r['envoy_cpu_us']:.1f} µs "
                     f"of CPU per request ({r['envoy_cpu_us'] - base:+.1f} against no filter), "
                     f"{r['status']}\n")
        lines.append("| thread | hook | where | share | µs per request |")
        lines.append("|---|---|---|---:|---:|")
        rest = 0.0
        for (thread, hook, what), share in sorted(r["shares"].items(), key=lambda kv: -kv[1]):
            if share < 0.005:
                rest += share
                continue
            lines.append(f"| {thread} | {hook} | {what} | {share:.1%} | "
                         f"{share * r['envoy_cpu_us']:.1f} |")
        under = sum(v for (_, hook, _), v in r["shares"].items() if hook != "-")
        if rest:
            lines.append(f"| | | the rest, each under 0.5 % | {rest:.1%} | "
                         f"{rest * r['envoy_cpu_us']:.1f} |")
        lines.append(f"| | | under the module's hooks, in all | {under:.1%} | "
                     f"{under * r['envoy_cpu_us']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per run")
    parser.add_argument("--out", help="write the tables here too")
    parser.add_argument("--cases", help="only these cases, by key (comma-separated: "
                        + ",".join(c[0] for c in CASES) + ")")
    args = parser.parse_args()
    wanted = set(args.cases.split(",")) if args.cases else {c[0] for c in CASES}
    if not shutil.which("perf"):
        raise SystemExit("perf is missing (Debian's linux-perf)")
    if not (MODULE_DIR / MODULE_SO).exists():
        raise SystemExit(f"{MODULE_DIR / MODULE_SO} is missing: run `make profile`")
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(MODULE_DIR)
    with alone.started("profile") as (bench, workdir):
        results = []
        for case in (c for c in CASES if c[0] in wanted):
            print(f"{case[1]} ...", flush=True)
            results.append(measure_case(bench, workdir, case, args.seconds))
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")

if __name__ == "__main__":
    main()
