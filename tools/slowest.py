"""Prints the slowest tests of a `make test` run, the last thing it prints.

Each test stage leaves what it timed in target/test-times/: pytest's JUnit XML reports
(`<stage>.xml`, one time per test) and cargo test's output (`<stage>.log`, one time per
test binary: cargo reports no finer time on stable Rust). A slow test shows here before it
pushes `make test` past its goal; docs/testing.md says where a long case goes instead.

    python3 tools/slowest.py target/test-times [--top 15]
"""

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# cargo test's "Running tests/x.rs (target/...)" and, after its tests, "finished in 1.23s".
RUNNING = re.compile(r"^\s*Running (\S+)")
FINISHED = re.compile(r"^test result: .* finished in ([0-9.]+)s")


def pytest_times(report):
    """(seconds, stage, test id) for each test case of a JUnit XML report."""
    stage = report.stem
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        yield float(case.get("time") or 0), stage, name


def cargo_times(log):
    """(seconds, stage, binary) for each test binary cargo ran in `log`."""
    stage, running = log.stem, None
    for line in log.read_text(errors="replace").splitlines():
        if m := RUNNING.match(line):
            running = m.group(1)
        elif (m := FINISHED.match(line)) and running:
            yield float(m.group(1)), stage, running
            running = None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    times = []
    for report in sorted(args.dir.glob("*.xml")):
        times.extend(pytest_times(report))
    for log in sorted(args.dir.glob("*.log")):
        times.extend(cargo_times(log))
    if not times:
        sys.exit(f"no test times in {args.dir}")
    times.sort(reverse=True)
    print(f"slowest {min(args.top, len(times))} of {len(times)} timed tests and test binaries:")
    for seconds, stage, name in times[: args.top]:
        print(f"  {seconds:7.1f} s  {stage:<8} {name}")


if __name__ == "__main__":
    main()
