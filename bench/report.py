"""REPORT.md (and latency.svg) from the results of one `make bench` run."""

from pathlib import Path

import plot
from measure import TIMEOUT_MS


def ms(us):
    return f"{us / 1000:.2f}"


def statuses(status):
    total = sum(status.values()) or 1
    return ", ".join(f"{code}: {100 * n / total:.0f}%" for code, n in sorted(status.items()))


def busy(load):
    if max(load) < 0.7:
        return ""
    return (" — **the machine was busy with other work**, so every number below is lower "
            "and noisier than on an idle machine")


def headline(configs):
    base1, base2 = configs[0]["rps"], configs[1]["rps"]
    rows = ["| # | configuration | req/s | × 1 | × 2 | p50 ms | p99 ms | p99.9 ms | responses |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in configs:
        spread = f" ({min(c['rps_runs']):.0f}–{max(c['rps_runs']):.0f})" if len(c["rps_runs"]) > 1 else ""
        errors = f", {c['errors']} errors" if c["errors"] else ""
        rows.append(f"| {c['id']} | {c['label']} | {c['rps']:.0f}{spread} | {c['rps'] / base1:.2f} "
                    f"| {c['rps'] / base2:.2f} | {ms(c['p50'])} | {ms(c['p99'])} | {ms(c['p999'])} "
                    f"| {statuses(c['status'])}{errors} |")
    by_id = {c["id"]: c for c in configs}
    added = [f"- config {i}: **+{(by_id[i]['p99'] - by_id[2]['p99']) / 1000:.2f} ms** over the no-op wasm "
             f"(+{(by_id[i]['p99'] - by_id[1]['p99']) / 1000:.2f} ms over no filter)" for i in (4, 5, 6, 7)]
    failures = [f"- config {c['id']}: {statuses(c['status']).split('503: ')[1].split(',')[0]} "
                f"503s; the filter's counters over all rounds: {counters(c['counters'])}"
                for c in configs if "503" in c["status"]]
    note = ""
    if failures:
        note = (f"\n\n503s mean a check that did not come back within `timeout_ms` ({TIMEOUT_MS} ms) or a "
                "request refused while the circuit breaker was open (five failures in a row "
                "open it for a second). On a busy machine one stall of the bridge or Valkey is "
                "enough:\n\n" + "\n".join(failures))
    return ("\n".join(rows) + note + "\n\np99 added by the rate limiter:\n\n"
            + "\n".join(added))


def redis_table(rows):
    ours = rows[0]
    out = ["| pattern | Redis µs per check | × ours | Redis CPU s per 100k checks | × ours | bytes per bucket |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['usec_per_check']:.2f} | "
                   f"{r['usec_per_check'] / ours['usec_per_check']:.2f} | {r['cpu_s_per_100k']:.2f} | "
                   f"{r['cpu_s_per_100k'] / max(ours['cpu_s_per_100k'], 1e-9):.2f} | "
                   f"{r['bytes_per_bucket']:.0f} |")
    return "\n".join(out)


def overload(o):
    failed = o["status"].get("503", 0) / max(1, sum(o["status"].values()))
    return (f"| req/s | p50 ms | p99 ms | p99.9 ms | responses |\n|---:|---:|---:|---:|---|\n"
            f"| {o['rps']:.0f} | {ms(o['p50'])} | {ms(o['p99'])} | {ms(o['p999'])} | "
            f"{statuses(o['status'])} |\n\n"
            f"{100 * failed:.0f}% of the requests were answered 503 (req/s counts them too): a "
            f"callout not answered within `timeout_ms` ({TIMEOUT_MS} ms) on the saturated worker is a "
            f"backend failure, five in a row open the circuit breaker, and `failure_mode: "
            f"closed` turns both into refusals. The filter's counters over warm-up and run: "
            f"{counters(o.get('counters', {}))}.")


def counters(c):
    names = ["callouts", "allowed", "denied", "backend_failures", "short_circuits"]
    shown = [f"`{n}` {c[n]:,}" for n in names if n in c]
    return ", ".join(shown) if shown else "not available"


def bridge_table(rows):
    out = ["| in-flight callouts | checks per callout | checks/s | callout p50 ms | callout p99 ms | responses |",
           "|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['in_flight']} | {r['checks_per_callout']} | {r['checks_per_s']:.0f} | "
                   f"{ms(r['p50'])} | {ms(r['p99'])} | {statuses(r['status'])} |")
    return "\n".join(out)


def cluster_table(rows):
    out = ["| Redis | checks/s | script calls per check | Redis µs per check (all nodes) | Redis CPU s per 100k checks | callout p99 ms | responses |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['checks_per_s']:.0f} | {r['script_calls_per_check']:.2f} | "
                   f"{r['usec_per_check']:.2f} | {r['cpu_s_per_100k']:.2f} | {ms(r['p99'])} | "
                   f"{statuses(r['status'])} |")
    return "\n".join(out)


def accuracy_table(rows):
    names = {"ratelimit": "ratelimit.wasm (one bucket in Redis)",
             "local": "Envoy local_ratelimit (one bucket per gateway)"}
    out = ["| filter | limit | sent | admitted | expected | admitted / expected |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {names[r['filter']]} | {r['limit_per_s']}/s | {r['sent']} | {r['admitted']} | "
                   f"{r['expected']:.0f} | **{r['ratio']:.3f}** |")
    return "\n".join(out)


def fuel(wasm):
    if not wasm.get("fuel"):
        return (f"Fuel per allowed / denied request: **not available yet** "
                f"({wasm.get('fuel_missing', 'no fuel measurement')}).")
    f = wasm["fuel"]
    return (f"Wasm fuel per request (wasmtime harness, `bench/fuel`; about one unit per wasm "
            f"instruction, median of {f['requests']}, from request headers to the end of the "
            f"stream, bridge reply simulated):\n\n"
            f"| request | fuel | × no-op filter |\n|---|---:|---:|\n"
            f"| allowed (callout, reply, X-RateLimit-* headers) | {f['allowed']:,} | {f['allowed'] / f['noop']:.1f} |\n"
            f"| denied (callout, reply, 429) | {f['denied']:,} | {f['denied'] / f['noop']:.1f} |\n"
            f"| no-op filter | {f['noop']:,} | 1.0 |")


def write(out, results, smoke=False):
    out = Path(out)
    m, configs, o = results["machine"], results["configs"], results["overload"]
    s = results["settings"]
    (out / "latency.svg").write_text(plot.svg(configs, f"Latency per configuration ({m['date']})"))
    sizes = results["wasm"]["sizes"]
    text = f"""# Benchmark report{' (SMOKE RUN: numbers meaningless)' if smoke else ''}

Written by `make bench` (`bench/run.py`) on **{m['date']}** in {results['bench_seconds']:.0f} s.

Machine: {m['nproc']} cores ({m['cpu']}), {m['memory']} memory, Linux {m['kernel']};
Envoy {m['envoy']} (`--concurrency 1`, V8), Valkey {m['valkey']}, {m['rustc']}.
Everything (load generator, Envoy, bridge, Valkey) shares these cores on loopback, so
absolute numbers drift with the machine and its neighbours: compare **ratios** across runs.
1-minute load average before the run {m['load'][0]:.2f}, after it {m['load'][1]:.2f}{busy(m['load'])}.

## Envoy configurations 1-7

`loadgen` (bench/src, one thread) keeps {16} keep-alive HTTP/1.1 requests in flight for
{s['duration']:g} s after a {s['warmup']:g} s warm-up, {s['rounds']} round(s) over the seven
configurations in turn; each number is the median over the rounds (req/s range in brackets).
Configurations 4-7 go through the bridge (`--threads 1`) and Valkey; `timeout_ms` {TIMEOUT_MS},
`failure_mode` closed, so a slow check shows up as a 503.

{headline(configs)}

![latency per configuration](latency.svg)

## Overload: configuration 4 with {o['in_flight']} requests in flight

{overload(o)}

## Redis cost per check (no Envoy)

{s['redis_checks']:,} checks per pattern over 10,000 keys, pipelined 100 at a time, on the same
Valkey; each pattern after `CONFIG RESETSTAT`.

{redis_table(results['redis'])}

## Bridge throughput (no Envoy)

`loadgen --h2 --method POST` straight to `/v1/check` on one h2c connection (as a gateway
talks to it), 10,000 keys, the bridge on one worker thread.

{bridge_table(results['bridge'])}

## One Valkey vs a 3-primary Valkey Cluster

The bridge (one thread) answering 16 in-flight callouts of one check with **two** rules
(`bench:cl:a:*`, `bench:cl:b:*`, 10,000 users): on one server a check is one script call;
in the cluster its two buckets usually hash to different slots, so it costs two script
calls on two primaries, in parallel (and a refund on a denial, none here). All three
primaries share this machine's two cores with everything else.

{cluster_table(results.get('cluster', []))}

## Accuracy: one client at 2x its limit through two gateways

{accuracy_table(results['accuracy'])}

## Wasm

`dist/ratelimit.wasm`: {sizes['ratelimit.wasm']:,} bytes (the no-op filter: {sizes['noop']:,} bytes).
{fuel(results['wasm'])}

## How to read the numbers

- **req/s**: responses per second over the measured window at {16} requests in flight
  (closed loop: a slower configuration gets fewer requests, not a queue).
- **× 1, × 2**: req/s divided by configuration 1 (Envoy alone, the ceiling) and by 2 (a
  no-op wasm filter, the floor any wasm filter pays). 0.50 means half the throughput.
- **p50 / p99 / p99.9**: latency percentiles of every request of the window (all are
  recorded, nearest rank), measured by the client from send to the end of the body.
- **p99 added**: p99 of the configuration minus p99 of the no-op wasm (and of no filter).
- **responses**: the share of each HTTP status; 200 allowed, 429 denied, 503 a check that
  failed or exceeded `timeout_ms` (should be 0%). Configuration 5 checks two rules per
  request: a bucket per user (10,000 users, never empty) and a bucket per tier, where the
  users of tier `t0` (every other user) share one bucket of one request a day, so half of
  the requests are 429 and a denied request takes no token from its user.
- **Overload**: configuration 4 pushed past saturation; the share of 503s is the share of
  legitimate requests a saturated gateway refuses with the default timeout and
  `failure_mode: closed` (the p99 of a saturated closed loop is queueing, by design).
- **Redis µs per check**: server time (`INFO commandstats` `usec`) of the commands the
  client sent, divided by the checks; for the scripts it is `usec_per_call` of `EVALSHA`,
  which includes the commands the script runs. Nested commands are not counted twice.
- **Redis CPU s per 100k checks**: `used_cpu_sys + used_cpu_user` of the server over the
  pattern, scaled to 100,000 checks; includes reading and parsing the requests, so it also
  shows what a pipeline of several commands per check costs.
- **bytes per bucket**: mean `MEMORY USAGE key SAMPLES 0` over 50 of the pattern's keys.
- **checks/s** (bridge): callouts per second times checks per callout, at a fixed number
  of callouts in flight; the p50/p99 are per callout.
- **admitted / expected**: 200s divided by what the limit allows over the client's sending
  window (a full bucket of {results['accuracy'][0]['limit_per_s']} plus
  {results['accuracy'][0]['limit_per_s']}/s of refill); 1.000 is exact, the issue asks for
  ±1%. Envoy's `local_ratelimit` keeps a bucket per gateway, so two gateways admit about
  twice the limit.

## Reproduce

```sh
make bench                         # builds, runs all of the above (~{max(1, round(results['bench_seconds'] / 60))} min), writes bench/REPORT.md
make bench-smoke                   # ~1 s per configuration, asserts sane output, writes nothing here
.venv/bin/python bench/run.py --rounds 1 --duration 5 --out /tmp/bench   # a quicker look
target/release/loadgen --help      # the load generator on its own
```
"""
    (out / "REPORT.md").write_text(text)
