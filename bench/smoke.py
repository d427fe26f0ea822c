"""Sanity checks of a `--smoke` run: the scripts produced numbers that can be true. The
numbers of a half-second run are noise; only their shape and the limiter's behaviour are
asserted, so that the bench cannot rot unnoticed."""

import xml.etree.ElementTree as ET
from pathlib import Path

from .measure import BETWEEN_NOOPS, CONFIGS, IN_FLIGHT

# A smoke run's measured and warm-up seconds per run, in every section that runs loads:
# enough requests for the checks below, little enough that `make test` carries it (at 1 s
# and 0.3 s the smoke run took 187 s of it).
RUN_S, WARMUP_S = 0.5, 0.2

# Every counter of a decided request.
DECIDED = ("allowed", "allowed_leased", "denied", "denied_cached", "blocked")
# Configurations the workers decide without the bridge, once warm.
LOCAL = ("denied", "leased")


def diagnostics(c, lv, at, expect):
    """The filter's counters and Valkey agree with what loadgen saw and with the
    configuration's transport; counters a filter build lacks are `None` and not checked."""
    d = lv.get("diagnostics")
    expect(d is not None, f"{at}: no diagnostics")
    if d is None:
        return
    if "allowed" in d["outcomes"]:
        decided = sum(d["outcomes"].get(k, 0) for k in DECIDED)
        expect(decided >= 0.9 * d["requests"], f"{at}: counters saw {decided} of {d['requests']}")
    per_request = d["exchanges_per_request"]
    if c["key"] in LOCAL:
        # Decided by the worker itself (deny cache, leases): hardly any exchange.
        expect(per_request is None or per_request <= 0.05,
               f"{at}: {per_request} exchanges per request, though decided locally")
        return
    expect(per_request is None or 0 < per_request <= 1.05,
           f"{at}: {per_request} exchanges per request")
    per_exchange = d["checks_per_exchange"]
    expect(per_exchange is None or per_exchange >= 0.95,
           f"{at}: {per_exchange} checks per exchange")
    used = d["callouts_per_request" if c["transport"] == "http" else "stream_messages_per_request"]
    expect(used is None or used > 0, f"{at}: no exchange over its transport {c['transport']}")
    calls = d["script_calls_per_check"]
    expect(calls is None or calls > 0, f"{at}: Valkey saw no script call")
    share = d["batch_share"]
    expect(share is None or abs(sum(share.values()) - 1) < 1e-6, f"{at}: batch shares {share}")


def fleet_row(r, at, expect):
    """One fleet run completed without errors, every figure present and positive (no
    threshold: what the figures should be is the bridge's to change)."""
    expect(r["checks"] > 0 and r["checks_per_s"] > 0, f"{at}: no checks answered")
    expect(r["errors"] == 0 and r["failed_checks"] == 0,
           f"{at}: {r['errors']} errors, {r['failed_checks']} failed checks")
    for key in ("script_calls_per_check", "batch_size", "redis_cpu_us_per_check",
                "redis_cpu_us_per_rule_check", "bridge_cpu_us_per_check"):
        expect(r[key] is not None and r[key] > 0, f"{at}: {key} {r[key]}")
    expect(0 < r["p50"] <= r["p99"], f"{at}: percentiles {r['p50']}, {r['p99']}")
    if "filter" not in r:
        # The baselines beside a loadgen --grpc run (not the run through Envoy).
        for key in ("loadgen_cpu_us_per_check", "redis_set_us"):
            expect(r.get(key) is not None and r[key] > 0, f"{at}: {key} {r.get(key)}")
    for name, h in (r["bridge_batches"] or {}).items():
        expect(h["count"] > 0 and h["mean"] > 0, f"{at}: bridge batch histogram {name}: {h}")
    expect(r.get("bridge_p99_ms") is not None and r["bridge_p99_ms"] > 0,
           f"{at}: no exchange time from the bridge's /metrics: {r.get('bridge_p99_ms')}")


def check_fleet(fleet, expect=None):
    """The fleet section (bench/fleet.py): every run of both backends and the Envoy run."""
    problems = []
    expect = expect or (lambda ok, what: ok or problems.append(what))
    runs = [(r["redis"], r["checks_per_exchange"], r["rate"] is None) for r in fleet["runs"]]
    wanted = [(redis, k, closed) for redis in ("1 Valkey", "3-primary cluster")
              for k, closed in ((1, True), (8, True), (1, False), (1, False))]
    expect(runs == wanted, f"fleet runs: {runs}")
    for r in fleet["runs"]:
        fleet_row(r, f"fleet {r['redis']}, {r['load']}, {r['checks_per_exchange']} per exchange",
                  expect)
    envoy = fleet.get("envoy")
    expect(envoy is not None, "fleet: no run through Envoy")
    if envoy:
        fleet_row(envoy, "fleet through Envoy", expect)
        expect(set(envoy["status"]) == {"200"}, f"fleet through Envoy: {envoy['status']}")
        per_exchange = envoy["checks_per_exchange"]
        expect(per_exchange is None or per_exchange >= 0.95,
               f"fleet through Envoy: {per_exchange} checks per exchange")
    if problems:
        raise AssertionError("fleet smoke run failed:\n  " + "\n  ".join(problems))


def check_streams(streams, expect=None):
    """The streams section (bench/streams.py): every configuration answered every request
    with a whole stream, and the metered rule settled each for the usage it reported."""
    problems = []
    expect = expect or (lambda ok, what: ok or problems.append(what))
    by = {c["key"]: c for c in streams["configs"]}
    expect(list(by) == ["noop", "unmetered", "metered"], f"streams configurations: {list(by)}")
    for key, c in by.items():
        at = f"streams {key}"
        expect(c["rps"] > 0 and c["errors"] == 0, f"{at}: {c['rps']} rps, {c['errors']} errors")
        expect(set(c["status"]) == {"200"}, f"{at}: statuses {c['status']}")
        expect(c["body_frames_per_response"] >= 1, f"{at}: {c['body_frames_per_response']} "
               "body frames per response")
        ratios = c["x_noop"]["rounds"] + c["x_unmetered"]["rounds"]
        expect(len(ratios) == 2 * streams["rounds"] and all(r > 0 for r in ratios),
               f"{at}: ratios {ratios}")
    metered, unmetered = by.get("metered", {}), by.get("unmetered", {})
    counters, responses = metered.get("counters", {}), metered.get("responses", 0)
    settled = counters.get("settled", 0)
    # A settlement of the warm-up may land in the measured window, and one of its end in
    # the next snapshot's wait: within a few per cent of the responses.
    expect(0.95 * responses <= settled <= 1.05 * responses,
           f"streams metered: {settled} settled of {responses} responses")
    tokens = counters.get("metered_tokens", 0)
    expect(abs(tokens - settled * streams["tokens"]) <= 0.05 * tokens,
           f"streams metered: {tokens} tokens metered in {settled} settlements, not "
           f"{streams['tokens']} each")
    expect(counters.get("settle_failures", 0) == 0, f"streams metered: {counters}")
    expect(not unmetered.get("counters", {}).get("settled"),
           f"streams unmetered: settled {unmetered.get('counters')}")
    if problems:
        raise AssertionError("streams smoke run failed:\n  " + "\n  ".join(problems))


def check_side_by_side(name, section, keys, checking, expect=None):
    """A section of side_by_side.py's (`name`, its configurations `keys` in order): every
    configuration answered every request, 429 if its key ends in `deny` and 200 otherwise,
    Envoy's CPU was read, and the runs of the `checking` configurations, which reach the
    bridge, show the bridge's and Valkey's."""
    problems = []
    expect = expect or (lambda ok, what: ok or problems.append(what))
    by = {c["key"]: c for c in section["configs"]}
    expect(list(by) == keys, f"{name} configurations: {list(by)}")
    for key, c in by.items():
        for lv in c["levels"]:
            at = f"{name} {key} at {lv['in_flight']}"
            wanted = {"429"} if key.endswith("deny") else {"200"}
            expect(lv["rps"] > 0 and lv["errors"] == 0, f"{at}: {lv['rps']} rps, {lv['errors']} errors")
            expect(set(lv["status"]) == wanted, f"{at}: statuses {lv['status']}")
            per = lv["cpu_us_per_request"]
            expect(per.get("envoy", 0) > 0, f"{at}: Envoy CPU {per}")
            if key in checking:
                expect(per.get("bridge", 0) > 0 and per.get("valkey", 0) > 0, f"{at}: CPU {per}")
    if problems:
        raise AssertionError(f"{name} smoke run failed:\n  " + "\n  ".join(problems))


def check_rls(rls, expect=None):
    """The rate limit service's section (bench/rls.py)."""
    check_side_by_side("rls", rls, ["none", "noop", "wasm", "rls"], ("wasm", "rls"), expect)


def check_module(module, expect=None):
    """The dynamic module's section (bench/module.py), leased and denied included."""
    keys = ["none", "noop", "wasm", "local", "ldeny", "module", "mhttp", "wlease", "mlease",
            "wdeny", "mdeny"]
    check_side_by_side("module", module, keys, ("wasm", "module", "mhttp"), expect)


def check_regions(regions, expect):
    """The regions section (bench/regions.py): every case kept the bound and admitted, a
    cold key outside its home waited a round trip and a warm one did not, and the hot
    path of a global rule spent no more of its region's Redis than the regional rule."""
    for case in regions["cases"]:
        at = f"regions {case['key']}"
        expect(case["admitted_over_bound"] <= 1.0, f"{at}: {case['admitted_over_bound']} of the bound")
        expect(case["rate_share"] > 0.3, f"{at}: {case['rate_share']} of the rate")
    cold = regions["cold"]
    expect(cold["cold_p50_ms"] >= 140 > cold["warm_p50_ms"], f"regions cold keys: {cold}")
    hot = regions["hot_path"]
    expect(all(v["rps"] > 0 for v in hot.values()), f"regions hot path: {hot}")
    expect(hot["global"]["local_redis_us"] < hot["regional"]["local_redis_us"],
           f"regions hot path: {hot}")


def check(results, out):
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)

    configs = {c["key"]: c for c in results["configs"]}
    expect(sorted(configs) == sorted(c["key"] for c in CONFIGS), f"configurations: {sorted(configs)}")
    for key, c in configs.items():
        expect(sorted(lv["in_flight"] for lv in c["levels"]) == sorted(IN_FLIGHT),
               f"{key}: in-flight levels")
        for lv in c["levels"]:
            at = f"config {c['id']} at {lv['in_flight']}"
            expect(lv["rps"] > 0, f"{at}: no responses")
            expect(lv["errors"] == 0, f"{at}: {lv['errors']} errors")
            expect(0 < lv["p50"] <= lv["p99"] <= lv["p999"], f"{at}: percentiles out of order")
            share = {k: v / max(1, sum(lv["status"].values())) for k, v in lv["status"].items()}
            if key == "mixed":
                expect(0.3 < share.get("429", 0) < 0.7, f"{at}: denials not about half: {share}")
            elif key == "denied":
                expect(share.get("429", 0) >= 0.99, f"{at}: not all denied: {share}")
            else:
                expect(share.get("200", 0) >= 0.99, f"{at}: not all allowed: {share}")
            if c["kind"] == "ratelimit":
                diagnostics(c, lv, at, expect)
    for key in BETWEEN_NOOPS:
        paired = configs[key].get("paired") or {}
        ratios, status = paired.get("ratios", []), paired.get("status", {})
        expect(len(ratios) == results["settings"]["hot_rounds"] and all(r > 0 for r in ratios),
               f"{key} between no-op runs: {paired}")
        want = "429" if key == "denied" else "200"
        expect(set(status) == {want}, f"{key} between no-op runs: statuses {status}")
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
    # The bridge merges concurrent exchanges' checks: never more than a call per check on one
    # Valkey, nor more than one per node a check touches (two rules: two) on the cluster.
    expect(0 < calls.get("1 Valkey", 0) <= 1.0, f"at most a script call per check on one Valkey: {calls}")
    expect(0 < calls.get("3-primary cluster", 0) <= 2.0,
           f"at most a script call per node a check touches: {calls}")
    acc = {a["filter"]: a for a in results["accuracy"]}
    expect(0.9 < acc["ratelimit"]["ratio"] < 1.1, f"accuracy ratelimit.wasm: {acc['ratelimit']}")
    expect(0.9 < acc["leased"]["ratio"] < 1.1, f"accuracy with leases: {acc['leased']}")
    expect(acc["local"]["ratio"] > 1.3, f"accuracy local_ratelimit: {acc['local']}")
    expect(results["wasm"]["sizes"]["ratelimit.wasm"] > 0, "wasm size")
    fuel = results["wasm"]["fuel"]
    expect(fuel is None or fuel["denied"] > fuel["noop"] > 0 and fuel["allowed"] > fuel["noop"]
           and fuel["headers_floor"] > fuel["noop"]
           and fuel["stream_metered"] > fuel["stream_unmetered"] > 0, f"wasm fuel: {fuel}")
    expect("fleet" in results, "no fleet section")
    if "fleet" in results:
        check_fleet(results["fleet"], expect)
    expect("streams" in results, "no streams section")
    if "streams" in results:
        check_streams(results["streams"], expect)
    expect("regions" in results, "no regions section")
    if "regions" in results:
        check_regions(results["regions"], expect)
    expect("rls" in results, "no rate limit service section")
    if "rls" in results:
        check_rls(results["rls"], expect)
    expect("module" in results, "no dynamic module section")
    if "module" in results:
        check_module(results["module"], expect)
    report = (Path(out) / "REPORT.md").read_text()
    expect(all(f"| {c['id']} | {c['label']} |" in report for c in CONFIGS)
           and "Acceptance (throughput issue):" in report and "admitted / expected" in report
           and "Acceptance (hot keys issue):" in report and "## Fleet" in report
           and "## Metering on streamed responses" in report
           and "## Envoy's own ratelimit filter" in report
           and "## The filter as a native dynamic module" in report,
           "REPORT.md incomplete")
    expect(ET.parse(Path(out) / "latency.svg").getroot().tag.endswith("svg"), "latency.svg")
    if problems:
        raise AssertionError("bench smoke run failed:\n  " + "\n  ".join(problems))
