"""Sanity checks of a `--smoke` run: the scripts produced numbers that can be true. The
numbers of a one-second run are noise; only their shape and the limiter's behaviour are
asserted, so that the bench cannot rot unnoticed."""

import xml.etree.ElementTree as ET
from pathlib import Path


def check(results, out):
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)

    configs = {c["id"]: c for c in results["configs"]}
    expect(sorted(configs) == [1, 2, 3, 4, 5, 6, 7], "seven configurations")
    for cid, c in configs.items():
        expect(c["rps"] > 0, f"config {cid}: no responses")
        expect(c["errors"] == 0, f"config {cid}: {c['errors']} errors")
        expect(0 < c["p50"] <= c["p99"] <= c["p999"], f"config {cid}: percentiles out of order")
    share = {cid: {k: v / max(1, sum(c["status"].values())) for k, v in c["status"].items()}
             for cid, c in configs.items()}
    for cid in (1, 2, 3, 4, 7):
        expect(share[cid].get("200", 0) >= 0.99, f"config {cid}: not all allowed: {share[cid]}")
    expect(0.3 < share[5].get("429", 0) < 0.7, f"config 5: denials not about half: {share[5]}")
    expect(share[6].get("429", 0) >= 0.99, f"config 6: not all denied: {share[6]}")
    o = results["overload"]
    expect(o["rps"] > 0 and set(o["status"]) <= {"200", "503"}, f"overload: {o}")
    for r in results["redis"]:
        expect(r["usec_per_check"] > 0 and r["cpu_s_per_100k"] > 0 and r["bytes_per_bucket"] > 0,
               f"redis {r['pattern']}: missing numbers {r}")
    for b in results["bridge"]:
        expect(b["checks_per_s"] > 0 and set(b["status"]) == {"200"}, f"bridge: {b}")
    for c in results["cluster"]:
        expect(c["checks_per_s"] > 0 and set(c["status"]) == {"200"} and c["usec_per_check"] > 0,
               f"cluster cost: {c}")
    calls = {c["label"]: c["script_calls_per_check"] for c in results["cluster"]}
    expect(0.9 < calls.get("1 Valkey", 0) < 1.1, f"one script call per check on one Valkey: {calls}")
    expect(1.2 < calls.get("3-primary cluster", 0) <= 2.1, f"a call per slot in the cluster: {calls}")
    acc = {a["filter"]: a for a in results["accuracy"]}
    expect(0.9 < acc["ratelimit"]["ratio"] < 1.1, f"accuracy ratelimit.wasm: {acc['ratelimit']}")
    expect(acc["local"]["ratio"] > 1.3, f"accuracy local_ratelimit: {acc['local']}")
    expect(results["wasm"]["sizes"]["ratelimit.wasm"] > 0, "wasm size")
    fuel = results["wasm"]["fuel"]
    expect(fuel is None or fuel["denied"] > fuel["noop"] > 0 and fuel["allowed"] > fuel["noop"],
           f"wasm fuel: {fuel}")
    report = (Path(out) / "REPORT.md").read_text()
    expect("| 6 |" in report and "admitted / expected" in report, "REPORT.md incomplete")
    expect(ET.parse(Path(out) / "latency.svg").getroot().tag.endswith("svg"), "latency.svg")
    if problems:
        raise AssertionError("bench smoke run failed:\n  " + "\n  ".join(problems))
