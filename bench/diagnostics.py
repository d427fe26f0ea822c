"""What a rate-limiter run cost besides time: the filter's counters and Valkey's script
statistics, read before and after each measured run, and the per-request numbers derived
from their deltas (exchanges per request, checks per exchange, batch sizes, script calls
per check, Redis µs per rule-check).

Counters a filter build does not have are absent from the deltas and come out as `None`
(the report prints "-"), so an older or newer filter never breaks the bench.
"""

import os
import time
from pathlib import Path

import valkey

from . import redis_cost

# Exchanges with the bridge: HTTP callouts and messages on the gRPC stream.
EXCHANGES = ("callouts", "stream_messages")
# Requests the filter decided, one counter per outcome.
OUTCOMES = ("allowed", "allowed_leased", "denied", "denied_cached", "blocked",
            "backend_failures", "short_circuits")
# Exchanges by the number of checks they carried.
BATCH_BUCKETS = ("batch_1", "batch_2_3", "batch_4_7", "batch_8_15", "batch_16_31",
                 "batch_32_63", "batch_64_up")
# Metered rules' tokens and settlements (bench/streams.py).
METERING = ("metered_tokens", "settled", "debt", "settle_failures")
COUNTERS = (*EXCHANGES, "checks_sent", *BATCH_BUCKETS, *OUTCOMES, *METERING)
# Valkey commands that run the token-bucket script.
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall")


class Probe:
    """Reads one gateway's counters and Valkey's script statistics around measured runs,
    and with `bridge` (its process) the CPU time of the gateway, the bridge and Valkey."""

    def __init__(self, gateway, redis_port, settles=False, bridge=None):
        """`settles`: every allowed request settles a metered rule once its response
        ends, so snapshots wait for the settlements too."""
        self.gateway, self.settles, self.bridge = gateway, settles, bridge
        self.valkey = valkey.Valkey(host="127.0.0.1", port=redis_port, socket_timeout=5)
        # Requests sent to the gateway so far, to know when its counters have caught up.
        self.sent = 0

    def close(self):
        self.valkey.close()

    def snapshot(self):
        """Counters and Valkey numbers now, once the counters account for every request
        sent, and its settlement if `settles` (a filter may flush its counters
        periodically; at most ~2 s of waiting)."""
        deadline = time.monotonic() + 2.0
        while True:
            counters = self.gateway.counters()
            decided = sum(counters.get(k, 0) for k in OUTCOMES)
            settled = not self.settles or counters.get("settled", 0) >= counters.get("allowed", 0)
            if (decided >= self.sent and settled or "allowed" not in counters
                    or time.monotonic() > deadline):
                break
            time.sleep(0.05)
        stats = self.valkey.info("commandstats")
        calls = usec = 0
        for command in SCRIPT_COMMANDS:
            entry = stats.get(f"cmdstat_{command}", {})
            calls, usec = calls + entry.get("calls", 0), usec + entry.get("usec", 0)
        cpu = {} if self.bridge is None else {
            "envoy_cpu_us": process_cpu_seconds(self.gateway.process.proc.pid) * 1e6,
            "bridge_cpu_us": process_cpu_seconds(self.bridge.pid) * 1e6,
            "valkey_cpu_us": redis_cost.cpu_seconds(self.valkey.info("cpu")) * 1e6}
        return {**{k: counters[k] for k in COUNTERS if k in counters},
                "script_calls": calls, "script_usec": usec, **cpu}


def process_cpu_seconds(pid):
    """User + system CPU of a live process, from /proc/<pid>/stat (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def add(total, before, after):
    """Adds the delta between two snapshots to `total` (a dict of sums)."""
    for k in after:
        total[k] = total.get(k, 0) + after[k] - before.get(k, 0)


def derive(delta, requests, rules):
    """Per-request numbers from the summed deltas of `requests` responses whose checks
    carry `rules` rules each; `None` where a counter is missing."""
    def ratio(num, den):
        return num / den if num is not None and den else None

    exchanges = None
    if any(k in delta for k in EXCHANGES):
        exchanges = sum(delta.get(k, 0) for k in EXCHANGES)
    checks = delta.get("checks_sent")
    batches = {k: delta[k] for k in BATCH_BUCKETS if k in delta}
    batched = sum(batches.values())
    return {
        "requests": requests,
        "exchanges_per_request": ratio(exchanges, requests),
        "callouts_per_request": ratio(delta.get("callouts"), requests),
        "stream_messages_per_request": ratio(delta.get("stream_messages"), requests),
        "checks_per_exchange": ratio(checks, exchanges),
        "batch_share": {k: v / batched for k, v in batches.items()} if batched else None,
        "script_calls_per_check": ratio(delta["script_calls"], checks),
        "redis_usec_per_rule_check": ratio(delta["script_usec"], checks and checks * rules),
        "outcomes": {k: delta[k] for k in OUTCOMES if k in delta},
    }
