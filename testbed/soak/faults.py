"""The chaos: what each fault breaks and how it comes back, the scenarios (which faults, on
which backend), and the schedule that injects them in turn, waits for limiting to resume
and probes that it is exact. Each fault is recorded as a Window for the analysis."""

import time
from dataclasses import dataclass, field

from ..cluster import SLOTS
from ..stack import wait_for
from .load import get_status
from .settings import (ATTACK_SLOTS, BRIDGE_DOWN_S, FAULT_SPACING_S, MIN_STEADY_S, PROBE_BURST,
                       PROBE_EXTRA, RECOVERY_TIMEOUT_S, REJOIN_AFTER_S, VALKEY_DOWN_S)


@dataclass
class Window:
    """One fault: from its injection (`start`) to the component being back (`end`), then
    to both gateways limiting again (`recovered`, None if they never did); the probe's
    statuses after it."""
    fault: str
    start: float
    end: float = None
    recovered: float = None
    probe: list = field(default_factory=list)
    note: str = ""
    failed: bool = False


# Faults: each breaks one component and returns when it is back, with a note for the report.

def restart_valkey(stack, _cluster, _occurrence):
    stack.valkey.stop()
    time.sleep(VALKEY_DOWN_S)
    stack.start_valkey()
    return f"stopped, started again on :{stack.redis_port} {VALKEY_DOWN_S:.0f} s later (empty)"


def kill_bridge(stack, _cluster, _occurrence):
    stack.bridge.kill()
    time.sleep(BRIDGE_DOWN_S)
    stack.start_bridge()
    return f"SIGKILL, started again {BRIDGE_DOWN_S:.0f} s later"


def fail_over_primary(_stack, cluster, occurrence):
    """Kills the primary of one slot range in turn; its replica takes over; the killed
    node restarts and rejoins as the new primary's replica (so the next failover of its
    range has a replica again)."""
    slot = (occurrence % len(cluster.primaries)) * (SLOTS // len(cluster.primaries))

    def owner():
        live = next(n for n in cluster.nodes if n.alive())
        port = cluster.slot_owners(live)[slot]
        return next(n for n in cluster.nodes if n.port == port)

    victim = owner()
    victim.process.kill()
    killed = time.monotonic()
    wait_for("a replica to take over", lambda: owner() is not victim and cluster.healthy(),
             timeout=RECOVERY_TIMEOUT_S)
    failover_s = time.monotonic() - killed
    successor = owner()
    time.sleep(REJOIN_AFTER_S)
    victim.restart()

    def rejoined():
        role = victim.cmd("ROLE")
        return role[0] in ("slave", "replica") and int(role[2]) == successor.port and role[3] == "connected"

    wait_for(f"{victim.process.name} to rejoin as a replica", rejoined, timeout=RECOVERY_TIMEOUT_S)
    wait_for("cluster state ok", cluster.healthy, timeout=RECOVERY_TIMEOUT_S)
    return (f"{victim.process.name} (:{victim.port}) SIGKILL; {successor.process.name} took over "
            f"in {failover_s:.1f} s; {victim.process.name} rejoined as its replica")


@dataclass
class Scenario:
    name: str
    title: str
    cluster: bool
    faults: list  # [(label, function)], injected in turn
    attacked: bool = False


SCENARIOS = [
    Scenario("single", "single Valkey, two gateways, one bridge", False,
             [("Valkey restart", restart_valkey), ("bridge kill -9", kill_bridge)]),
    Scenario("cluster", "Valkey Cluster (3 primaries, 1 replica each), two gateways, "
             "one bridge with --cluster", True,
             [("primary kill -9, failover", fail_over_primary), ("bridge kill -9", kill_bridge)]),
    Scenario("attacked", "single Valkey (maxmemory 2mb, volatile-ttl), two gateways, one "
             f"bridge with --token-file and --max-connections {ATTACK_SLOTS}, under attack", False,
             [("Valkey restart", restart_valkey), ("bridge kill -9", kill_bridge)], attacked=True),
]


def fault_times(duration):
    """Planned seconds of the faults: about one every FAULT_SPACING_S, at least two."""
    n = max(2, round(duration / FAULT_SPACING_S) - 1)
    return [duration * (k + 1) / (n + 1) for k in range(n)]


def wait_limiting(stack, tag):
    """When every gateway answers a fresh client with 200 and limit headers (bounded wait),
    as monotonic time; None if they never did."""
    headers = {"x-user-id": f"ready-{tag}"}

    def limiting():
        answers = [get_status(port, headers) for port in stack.ports]
        return all(status == 200 and limit is not None for status, limit in answers)

    try:
        wait_for("limiting to resume", limiting, timeout=RECOVERY_TIMEOUT_S)
    except RuntimeError:
        return None
    return time.monotonic()


def probe(stack, tag):
    """A fresh client of the probe rule sends PROBE_BURST + PROBE_EXTRA requests, one at a
    time, alternating between the gateways; returns the statuses."""
    headers = {"x-probe-id": f"probe-{tag}"}
    return [get_status(stack.ports[n % len(stack.ports)], headers)[0]
            for n in range(PROBE_BURST + PROBE_EXTRA)]


def sleep_until(at):
    while (left := at - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def chaos(scenario, stack, cluster, result):
    """Injects the scenario's faults in turn on the schedule; after each, waits for
    limiting to resume and probes it. Stops at the first fault the stack does not come
    back from."""
    last_ready = result.t0
    for k, planned in enumerate(fault_times(result.duration)):
        label, inject = scenario.faults[k % len(scenario.faults)]
        sleep_until(max(result.t0 + planned, last_ready + MIN_STEADY_S))
        window = Window(label, time.monotonic())
        result.windows.append(window)
        print(f"  {window.start - result.t0:5.0f} s  {label}", flush=True)
        try:
            window.note = inject(stack, cluster, k // len(scenario.faults))
        except Exception as e:  # noqa: BLE001 - whatever failed, the component is not back
            window.end, window.failed = time.monotonic(), True
            window.note = f"did not come back: {e}"
            return
        window.end = time.monotonic()
        window.recovered = wait_limiting(stack, f"{scenario.name}-{k}")
        if window.recovered is None:
            window.failed = True
            window.note += f"; limiting did not resume within {RECOVERY_TIMEOUT_S:.0f} s"
            return
        window.probe = probe(stack, f"{scenario.name}-{k}")
        last_ready = time.monotonic()
