"""Metering on streamed responses, a section of `make bench` (issue 25, item 5: "the bench
shows metering costs at most 5 % of req/s on streamed responses of 50 chunks").

Three Envoys (`--concurrency 1`) proxy to bench's `sse-upstream`, which answers every
request with an OpenAI-compatible stream of server-sent events (bench/src/events.rs, the
same as `wasm-fuel` meters), each written on its own: the no-op wasm filter, the real
filter with a per-user rule of a fixed cost, and the same rule metered on the stream's
usage with a reservation of that cost, so that the last two differ only by the metering
(reading every chunk, settling at the end). loadgen keeps 256 streams in flight over
10,000 users; rounds interleave the three (each run after a warm-up run of its own) and
the ratios are the medians of each round's, since neighbouring runs share the machine's
state. The filter's counters around every measured run show that each metered response
settled, and for how many tokens; the client's body frames per response show how many
chunks the filters were handed (Envoy reads what the upstream wrote since its last read
as one).

Standalone: `.venv/bin/python -m bench.streams [--smoke]` (after `make bench-build`):
starts its own Valkey and bridge, prints the section. Every process is a stack.Process,
stopped in `finally`.
"""

import json
import statistics
from pathlib import Path

from testbed import stack

from . import alone, smoke
from .cells import statuses
from .diagnostics import Probe
from .envoys import SSE_UPSTREAM, Gateway
from .measure import UNLIMITED, USERS, measured_run, plugin, summarise

# Streams in flight, their events GAP_MS apart as a model's tokens come: each event is a
# body chunk of its own at the gateway (back to back, Envoy reads several at once and the
# filter meters fewer, larger chunks), and enough streams are open at once for the
# gateway's CPU, not the gaps, to bound req/s.
IN_FLIGHT = 256
GAP_MS = 2
# What a request reserves, and what the unmetered rule takes: more than a response costs,
# as a reservation is.
RESERVE = 100
# The issue's bound on what metering may cost, as a share of the unmetered rule's req/s.
MAX_COST = 0.05
METER = {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 1}, "reserve": RESERVE}
HEADERS = [f"x-user-id: u{{n % {USERS}}}"]

CONFIGS = [
    {"key": "noop", "label": "Envoy + no-op wasm", "kind": "noop", "plugin": None},
    {"key": "unmetered", "label": f"ratelimit.wasm, per-user rule, cost {RESERVE}",
     "kind": "ratelimit",
     "plugin": plugin({"name": "stream-fixed", "limit": UNLIMITED, "cost": RESERVE})},
    {"key": "metered", "label": f"ratelimit.wasm, the same rule metered (reserve {RESERVE})",
     "kind": "ratelimit",
     "plugin": plugin({"name": "stream-metered", "limit": UNLIMITED, "meter": METER})},
]


def settings(short):
    """The section's settings in run.py's: `short` for the smoke run (~8 s; the full
    section takes about 80 s)."""
    return dict(stream_rounds=1, stream_duration=smoke.RUN_S, stream_warmup=smoke.WARMUP_S) if short else \
        dict(stream_rounds=5, stream_duration=4.0, stream_warmup=1.0)


class Upstream:
    """bench's `sse-upstream` on a port it picks, and what it announced it serves:
    {"port", "chunks", "tokens"} (tokens: the usage each response reports)."""

    def __init__(self, workdir):
        self.process = stack.Process(
            "sse-upstream", [str(SSE_UPSTREAM), "--port", "0", "--gap-ms", str(GAP_MS)], workdir)
        self.announced = None

    def start(self):
        self.process.start()
        stack.wait_for("sse-upstream", self.announcement, timeout=10,
                       proc=self.process.proc, log=self.process.log)
        return self

    def announcement(self):
        line, newline, _ = Path(self.process.log).read_text().partition("\n")
        if newline:
            self.announced = json.loads(line)
        return self.announced is not None

    def stop(self):
        self.process.stop()


def measure(bench, workdir, conf):
    """Every run of the section, through `bench`'s bridge and Valkey (a started
    testbed Stack); returns the results' "streams" entry."""
    workdir = Path(workdir) / "streams"
    workdir.mkdir(parents=True, exist_ok=True)
    timing = {"warmup": conf["stream_warmup"], "duration": conf["stream_duration"]}
    upstream, gateways, probes = Upstream(workdir), {}, {}
    runs = {c["key"]: [] for c in CONFIGS}
    totals = {c["key"]: {} for c in CONFIGS}
    try:
        upstream.start()
        for c in CONFIGS:
            gw = Gateway(f"envoy-stream-{c['key']}", c["kind"], workdir, bench.bridge_port,
                         c["plugin"], base="server", upstream_port=upstream.announced["port"])
            gateways[c["key"]] = gw.start()
            probes[c["key"]] = Probe(gw, bench.redis_port, settles=c["key"] == "metered",
                                     bridge=bench.bridge.proc)
        for rnd in range(conf["stream_rounds"]):
            for c in CONFIGS:
                r = measured_run(str(workdir), f"stream-{c['key']}-round{rnd}",
                                 gateways[c["key"]], probes[c["key"]], totals[c["key"]],
                                 {**c, "headers": HEADERS}, IN_FLIGHT, timing)
                runs[c["key"]].append(r)
                print(f"  round {rnd + 1} {c['key']:>9}: {r['rps']:7.0f} rps, "
                      f"{r['body_frames'] / max(1, r['responses']):4.1f} body frames per "
                      f"response  {r['status']}", flush=True)
    finally:
        for probe in probes.values():
            probe.close()
        for gw in gateways.values():
            gw.stop()
        upstream.stop()
    out = {**upstream.announced, "in_flight": IN_FLIGHT, "gap_ms": GAP_MS, "users": USERS,
           "reserve": RESERVE,
           "rounds": conf["stream_rounds"], "duration_s": conf["stream_duration"],
           "configs": []}
    for c in CONFIGS:
        key = c["key"]
        responses = sum(r["responses"] for r in runs[key])
        frames = sum(r["body_frames"] for r in runs[key])
        out["configs"].append({
            **c, **summarise(runs[key]), "responses": responses,
            "body_frames_per_response": frames / max(1, responses),
            "counters": totals[key],
            "cpu_us_per_response": {k.removesuffix("_cpu_us"): v / max(1, responses)
                                    for k, v in totals[key].items() if k.endswith("_cpu_us")},
            "x_noop": per_round(runs[key], runs["noop"]),
            "x_unmetered": per_round(runs[key], runs["unmetered"])})
    return out


def per_round(runs, baseline):
    """Each round's req/s over the baseline's in the same round, and their median."""
    ratios = [r["rps"] / b["rps"] for r, b in zip(runs, baseline)]
    return {"median": statistics.median(ratios), "rounds": ratios}


def count(c, name, fmt):
    """A filter counter's total over `c`'s measured runs and per response; "-" for the no-op
    filter, which has none."""
    total = c["counters"].get(name)
    n = max(1, c["responses"])
    return "-" if total is None else f"{total:,} ({format(total / n, fmt)} per response)"


def cpu(c):
    """The CPU time each process spent per response of `c`'s measured runs."""
    per = c["cpu_us_per_response"]
    return ", ".join(f"{per[p]:.0f}" if p in per else "-" for p in ("envoy", "bridge", "valkey"))


def table(streams):
    rows = ["| configuration | req/s | × no-op | × unmetered | body frames per response | "
            "settled | metered tokens | script calls, Redis µs per response | "
            "CPU µs per response: Envoy, bridge, Valkey | responses |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in streams["configs"]:
        errors = f", {c['errors']} errors" if c["errors"] else ""
        n, counters = max(1, c["responses"]), c["counters"]
        redis = (f"{counters['script_calls'] / n:.2f}, {counters['script_usec'] / n:.0f}"
                 if "script_calls" in counters else "-")
        rows.append(
            f"| {c['label']} | {c['rps']:.0f} | {c['x_noop']['median']:.3f} | "
            f"{c['x_unmetered']['median']:.3f} | {c['body_frames_per_response']:.1f} | "
            f"{count(c, 'settled', '.2f')} | {count(c, 'metered_tokens', '.1f')} | {redis} | "
            f"{cpu(c)} | "
            f"{statuses(c['status'])}{errors} |")
    return "\n".join(rows)


def verdict(streams):
    """The sentence holding the metered rule's req/s against the issue's bound."""
    by = {c["key"]: c for c in streams["configs"]}
    ratio = by["metered"]["x_unmetered"]
    rounds = ratio["rounds"]
    spread = f", {min(rounds):.3f}–{max(rounds):.3f}" if len(rounds) > 1 else ""
    cost = 1 - ratio["median"]
    met = "**met**" if cost <= MAX_COST else "**not met**"
    frames = by["metered"]["body_frames_per_response"]
    seen = "" if frames >= 0.9 * streams["chunks"] else (
        f" The metered filter was handed at most {frames:.1f} body chunks per response (the "
        f"client's data frames), not {streams['chunks']}: Envoy passes on at once what it read "
        "of the upstream at once, and read several events at a time when it fell behind; "
        "the filter's fuel for 50 chunks on their own is in the Wasm section.")
    envoy = {k: by[k]["cpu_us_per_response"].get("envoy") for k in ("metered", "unmetered")}
    gateway = "" if None in envoy.values() else (
        f" The gateway's own cost, Envoy's CPU per response, was {envoy['metered']:.0f} µs "
        f"metered against {envoy['unmetered']:.0f} µs: a gateway whose cores Envoy has to "
        f"itself serves {envoy['unmetered'] / envoy['metered']:.3f}× the req/s metered, a cost "
        f"of {1 - envoy['unmetered'] / envoy['metered']:.1%}; the settlement's other cost is "
        "the bridge's and Valkey's, sized per check like any other line.")
    return (f"Acceptance (issue 25, item 5, metering costs at most {MAX_COST:.0%} of req/s on "
            f"streamed responses of {streams['chunks']} chunks): the metered rule ran at "
            f"{ratio['median']:.3f}× the unmetered rule's req/s (median of {len(rounds)} "
            f"rounds' ratios{spread}), a cost of {cost:.1%}: {met}, with the bridge and Valkey "
            f"on the same two cores; {by['metered']['x_noop']['median']:.3f}× the no-op "
            f"filter's.{gateway}{seen}")


def section(streams):
    """The section of REPORT.md."""
    s = streams
    return f"""## Metering on streamed responses ({s['chunks']} chunks)

Envoy (`--concurrency 1`) proxies to `sse-upstream` (bench/src, one thread), which answers
each request with an OpenAI-compatible stream of {s['chunks']} server-sent events, each
written on its own {s['gap_ms']} ms after the last, as a model's tokens come, the last but
one reporting {s['tokens']} tokens of usage. The rule is
keyed by user ({s['users']:,} users) and never denies; unmetered it costs {s['reserve']}
tokens a request, metered it reserves {s['reserve']} and settles on the usage
(`usage.prompt_tokens` + `usage.completion_tokens`) when the stream ends. `loadgen` keeps
{s['in_flight']} requests in flight, reading every response to its end; {s['rounds']}
round(s) of {s['duration_s']:g} s runs, each after a warm-up, the three configurations in
turn. req/s is the median over rounds; × no-op and × unmetered the median of each round's
ratio.

{table(s)}

- **body frames per response**: data frames the client read. Envoy writes one HTTP/1.1
  chunk per body chunk its filters passed, and the client may read a chunk in two, so
  each filter was handed at most this many pieces of a response.
- **settled**, **metered tokens**: the filter's counters (`settled`, `metered_tokens`)
  over the measured runs: every metered response settles once, for the tokens its usage
  reported.
- **script calls, Redis µs per response**: Valkey's token-bucket script calls and their
  time (`INFO commandstats`) per response: the check, and for the metered rule its
  settlement too, which is part of what metering costs when the bridge and Valkey share
  the cores with Envoy.

{verdict(s)}
"""


def main():
    alone.run("streams", __doc__, measure, settings, section, smoke.check_streams)


if __name__ == "__main__":
    main()
