"""Runs tests again and again beside CPU-bound processes, to find the ones that pass by luck.

A test that passes on an idle machine and fails on a busy one waits on time, not on a
condition. This runs each named test `--runs` times (20 by default) with `--burners`
processes (2 by default, as many as CI's cores) spinning beside it, and reports how many
runs passed, with the slowest; it exits 1 unless every run of every test passed.

    python3 tools/flaky.py testbed/tests/test_rls.py::test_each_client_address_has_its_own_bucket
    python3 tools/flaky.py testbed/tests/test_overrides.py --runs 5
    python3 tools/flaky.py cargo:rls_reference cargo:leases::a_denied_check_takes_no_lease

A pytest node id or file is run with the project's .venv; `cargo:NAME[::FILTER]` is the
bridge's integration tests of bridge/tests/NAME.rs (a module of the one test binary
`it`), built once, then run with `NAME::FILTER` as the name filter, and `cargo:` alone the
whole binary. They run on RUST_TEST_THREADS threads, as `make test` runs them (`make flaky`
sets it to TEST_THREADS), or on one.
`make flaky TESTS="..."` runs this.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = ROOT / ".venv" / "bin" / "python"


def burn(stop):
    """One CPU-bound process: spins until `stop` is set."""
    n = 0
    while not stop.is_set():
        for _ in range(100_000):
            n = (n * 31 + 7) % 1_000_003


# The bridge's one integration test binary (bridge/tests/it.rs).
TEST_BINARY = "it"


def cargo_binary(name=TEST_BINARY):
    """Builds the bridge's integration test binary and returns its executable."""
    built = subprocess.run(
        ["cargo", "test", "-p", "ratelimit-bridge", "--test", name, "--no-run",
         "--message-format", "json"],
        cwd=ROOT, capture_output=True, text=True, check=True)
    for line in built.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable") \
                and message["target"]["name"] == name:
            return message["executable"]
    sys.exit(f"cargo built no test binary {name!r}")


def command_of(test):
    """The command that runs `test` once."""
    if test.startswith("cargo:"):
        module, _, filter_ = test[len("cargo:"):].partition("::")
        threads = os.environ.get("RUST_TEST_THREADS", "1")
        names = [f"{module}::{filter_}"] if module else []
        return [cargo_binary(), *names, "--test-threads", threads]
    return [str(PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", test]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="+", help="pytest node ids or files, or cargo:NAME[::FILTER]")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=2)
    args = parser.parse_args()
    commands = {test: command_of(test) for test in args.tests}
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,), daemon=True)
               for _ in range(args.burners)]
    for b in burners:
        b.start()
    failed = False
    try:
        for test, command in commands.items():
            passed, times, failures = 0, [], []
            for run in range(1, args.runs + 1):
                start = time.monotonic()
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                      env={**os.environ, "RUST_BACKTRACE": "0"})
                times.append(time.monotonic() - start)
                if done.returncode == 0:
                    passed += 1
                else:
                    failures.append((run, (done.stdout + done.stderr)[-3000:]))
            print(f"{test}: {passed} of {args.runs} passed beside {args.burners} burners, "
                  f"slowest {max(times):.1f} s, median {sorted(times)[len(times) // 2]:.1f} s",
                  flush=True)
            for run, output in failures:
                print(f"--- run {run} failed:\n{output}", flush=True)
            failed |= passed < args.runs
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
