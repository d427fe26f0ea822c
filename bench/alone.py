"""One section of `make bench` run on its own, `.venv/bin/python -m bench.<section>
[--smoke]` (after `make bench-build`): its own Valkey and bridge (testbed/stack.py), the
section's runs, its part of REPORT.md printed, and with `--smoke` its sanity checks. Every
process is a stack.Process, stopped in `finally`; the logs stay when a run fails."""

import argparse
import shutil
import tempfile
from contextlib import contextmanager

from testbed import stack


@contextmanager
def started(name, bridge_args=None):
    """A Valkey and a bridge (`bridge_args(workdir)`: its flags) in a fresh work directory:
    (stack, workdir), closed on the way out; the directory goes with them unless what ran
    failed, when its logs stay and where is printed."""
    workdir = tempfile.mkdtemp(prefix=f"ratelimit-{name}-")
    flags = bridge_args(workdir) if bridge_args else ()
    bench_stack = stack.Stack(plugin={}, gateways=0, workdir=workdir, bridge_args=flags)
    ok = False
    try:
        bench_stack.start()
        yield bench_stack, workdir
        ok = True
    finally:
        bench_stack.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{name} failed; logs kept in {workdir}")


def run(name, doc, measure, settings, section, check, bridge_args=None):
    """`measure(stack, workdir, settings(short))`, then `section` of its results printed
    and, with `--smoke`, `check` of them; `bridge_args(workdir)`: the bridge's flags."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="half a second per run, assert sanity")
    args = parser.parse_args()
    with started(name, bridge_args) as (bench_stack, workdir):
        results = measure(bench_stack, workdir, settings(short=args.smoke))
        print(section(results))
        if args.smoke:
            check(results)
            print("smoke: ok")
