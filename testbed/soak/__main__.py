"""`python -m testbed.soak` (`make soak`): the command line. Parses and bounds the flags,
runs the chosen scenarios one after the other in a temporary directory, prints the report
and writes it; the directory is removed on success and kept, with the logs and records,
when a check fails or the run is interrupted."""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from ..stack import ROOT
from . import __doc__ as OVERVIEW  # the package's: what the soak is, for --help
from .analysis import analyse
from .faults import SCENARIOS
from .report import report
from .run import run_scenario
from .settings import RATE


def main():
    parser = argparse.ArgumentParser(prog="python -m testbed.soak",
                                     description=OVERVIEW.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 10)),
                        help="length of the run, split between the scenarios (default "
                             "$SOAK_MINUTES or 10; 1 for a quick check)")
    parser.add_argument("--rate", type=float, default=RATE, help="steady requests/s in all")
    parser.add_argument("--out", default=str(ROOT / "testbed" / "SOAK.md"), help="the report")
    parser.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS],
                        help="run only this scenario (repeatable; default: all)")
    args = parser.parse_args()
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    if not 0.5 <= args.minutes <= 120:
        parser.error("--minutes must be within 0.5..120")
    if not 10 <= args.rate <= 1000:
        parser.error("--rate must be within 10..1000 (a soak, not a benchmark)")
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (a background
    # job); SIGTERM and SIGHUP leave through `finally` too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    workdir = tempfile.mkdtemp(prefix="ratelimit-soak-")
    per_scenario = args.minutes * 60 / len(scenarios)
    started, began, load_before = time.time(), time.monotonic(), os.getloadavg()[0]
    passed = False
    try:
        results = []
        for scenario in scenarios:
            print(f"{scenario.name}: {scenario.title}; {per_scenario:.0f} s of load", flush=True)
            results.append(run_scenario(scenario, per_scenario, args.rate, workdir))
        analyses = [analyse(r) for r in results]
        text, passed = report(results, analyses, args, started,
                              (load_before, os.getloadavg()[0]), time.monotonic() - began)
        print("\n" + text)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    finally:
        if passed:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"soak failed or interrupted; logs, requests.csv and rss.csv kept in {workdir}",
                  file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
