"""One scenario from start to end: the stack (and a Cluster or the attacks if the scenario
has them) started, the load, the memory sampler and the chaos run for the scenario's time,
everything stopped whatever happens, and the records kept for the analysis and for
whoever reads the logs of a failed soak."""

import atexit
import csv
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..attacks import Attacks, MeteringAbuser
from ..cluster import ValkeyCluster
from ..llm_upstream import LlmUpstream
from ..stack import Stack
from .faults import Scenario, chaos, probe, sleep_until
from .load import Load
from .memory import RssSampler
from .settings import (ATTACK_SLOTS, FRESH_PATH, FRESH_RATE, GRACE_S, LLM_KEY, LLM_PARALLEL,
                       LLM_PATH, LLM_PREFIX, LLM_WEIGHTS, MIN_STEADY_S, PLUGIN, TOKEN, USERS,
                       VALKEY_MEMORY, WORKERS, attacked_plugin)


@dataclass
class Result:
    """One scenario's run; times are monotonic."""
    scenario: Scenario
    duration: float
    t0: float
    t1: float = None
    windows: list = field(default_factory=list)
    baseline: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    rss: dict = field(default_factory=dict)
    counters: list = field(default_factory=list)
    attacks: str = ""
    # The metering abuser's responses, [(when its request came, tokens consumed)], and
    # its answers; None without the abuser.
    metering: list = None
    abuser: str = ""


def processes_of(stack, cluster):
    """The current [(name, stack.Process)] of a scenario, for the RSS sampler."""
    def current():
        procs = [(e.name, e) for e in stack.envoys] + [("bridge", stack.bridge)]
        if cluster is None:
            return procs + [("valkey", stack.valkey)]
        return procs + [(n.process.name, n.process) for n in cluster.nodes]
    return current


def write_records(workdir, result):
    """requests.csv (every steady-load request) and rss.csv (every memory sample), times
    in seconds from the start of the load, kept with the logs when the soak fails."""
    with open(workdir / "requests.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["sent_s", "latency_ms", "gateway", "status"])
        for sent, latency, status, gateway in sorted(result.requests):
            rows.writerow([f"{sent - result.t0:.4f}", f"{latency * 1000:.2f}", gateway, status])
    with open(workdir / "rss.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["t_s", "process", "pid", "rss_kib"])
        for (name, pid), samples in result.rss.items():
            rows.writerows([f"{t - result.t0:.1f}", name, pid, kib] for t, kib in samples)


def run_scenario(scenario, duration, rate, workdir):
    """Starts the scenario's stack, runs the load, the sampler and the chaos for
    `duration` seconds (longer if needed for the last fault's grace and some steady time
    after it), stops everything; returns the Result."""
    workdir = Path(workdir) / scenario.name
    workdir.mkdir()
    cluster = stack = load = sampler = attacks = abuser = upstream = None
    try:
        if scenario.cluster:
            cluster = ValkeyCluster(3, replicas=1)
            atexit.register(cluster.close)
            cluster.start()
        options = {}
        if scenario.attacked:
            token = workdir / "token"
            token.write_text(TOKEN)
            upstream = LlmUpstream().start()
            options = {"bridge_args": ["--token-file", str(token),
                                       "--max-connections", str(ATTACK_SLOTS)],
                       "valkey_args": VALKEY_MEMORY, "upstream": upstream.port,
                       "upstream_prefix": LLM_PREFIX}
        plugin = attacked_plugin() if scenario.attacked else PLUGIN
        stack = Stack(plugin, gateways=2, cluster=cluster, workdir=str(workdir), **options).start()
        result = Result(scenario, duration, t0=time.monotonic())
        load = Load(stack.ports, rate, USERS, WORKERS).start()
        sampler = RssSampler(processes_of(stack, cluster)).start()
        if scenario.attacked:
            attacks = Attacks(stack, TOKEN, ATTACK_SLOTS, FRESH_RATE, FRESH_PATH,
                              "x-fresh-id").start()
            abuser = MeteringAbuser(stack.ports, LLM_PATH, LLM_KEY, LLM_PARALLEL).start()
        result.baseline = probe(stack, f"{scenario.name}-baseline")
        chaos(scenario, stack, cluster, result)
        tail = result.windows[-1].end + GRACE_S + MIN_STEADY_S if result.windows else 0
        sleep_until(max(result.t0 + duration, tail))
        if attacks is not None:
            attacks.stop()
            evicted = stack.redis("INFO", "stats").get("evicted_keys", "?")
            result.attacks = f"{attacks.summary()}; Valkey evicted {evicted} keys"
        if abuser is not None:
            abuser.stop()
            result.abuser = abuser.summary()
            result.metering = [
                (s.at, LLM_WEIGHTS["prompt"] * s.tokens.prompt
                 + LLM_WEIGHTS["completion"] * s.tokens.completion)
                for s in upstream.served if s.headers.get("x-api-key") == LLM_KEY]
        load.stop()
        sampler.stop()
        result.t1 = time.monotonic()
        result.counters = [stack.stats(g) for g in range(len(stack.ports))]
        result.requests, result.rss = load.requests(), sampler.samples
        write_records(workdir, result)
        return result
    finally:
        for part in (attacks, abuser, load, sampler, upstream):
            if part is not None:
                part.stop()
        if stack is not None:
            stack.close()
        if cluster is not None:
            for node in cluster.nodes:
                if Path(node.process.log).exists():
                    shutil.copy(node.process.log, workdir)
            cluster.close()
