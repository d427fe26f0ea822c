"""Resident memory (VmRSS) of the run's processes: sampled from /proc for each process
lifetime while the soak runs, and judged flat or growing afterwards. A leak shows only
over minutes, which is why the soak, not the tests, watches for it."""

import statistics
import time

from ..stack import Background
from .settings import RSS_MIN_SAMPLES, RSS_SLACK_KIB, RSS_TOLERANCE, SAMPLE_EVERY_S


def rss_kib(pid):
    """VmRSS of a live process in KiB, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class RssSampler(Background):
    """VmRSS of the run's processes every SAMPLE_EVERY_S, per process lifetime: a
    restarted bridge or Valkey is a new process, sampled apart. `processes()` gives the
    current [(name, stack.Process)]."""

    def __init__(self, processes):
        self.processes = processes
        self.samples = {}  # (name, pid) -> [(monotonic time, KiB)]
        super().__init__()

    def run(self):
        while True:
            now = time.monotonic()
            for name, process in self.processes():
                proc = process.proc
                kib = rss_kib(proc.pid) if proc is not None and proc.poll() is None else None
                if kib is not None:
                    self.samples.setdefault((name, proc.pid), []).append((now, kib))
            if self.stopping.wait(SAMPLE_EVERY_S):
                return


def rss_trend(samples):
    """(first-quarter median, last-quarter median) in KiB of one lifetime's samples past
    its warm-up, or None when too few remain to judge."""
    values = [kib for _, kib in samples]
    values = values[len(values) // 5:]
    if len(values) < RSS_MIN_SAMPLES:
        return None
    quarter = len(values) // 4
    return statistics.median(values[:quarter]), statistics.median(values[-quarter:])


def rss_flat(first, last):
    return last - first <= max(RSS_TOLERANCE * first, RSS_SLACK_KIB)
