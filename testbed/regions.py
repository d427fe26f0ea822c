"""Several regions on one machine, for the tests of global rules (docs/regions.md): per
region a Valkey, a bridge started with `--region` and a `--region-redis` for every region,
and an Envoy gateway; every connection from one region's bridge to another region's Redis
goes through a `FaultProxy` of its own (testbed/netem.py), so a test adds latency between
two regions, cuts one off, or drops the replies one way, while each region's own path (its
gateway, bridge and Redis) stays on plain loopback, as it would stay inside a region.

`World(plugin, names)`: `world.regions[name]` is that region's `Stack` (one gateway),
`world.link(a, b)` the proxy `a`'s bridge reaches `b`'s Redis through; `world.start()`,
`world.close()`; `clocks` runs a region's bridge on a clock fast or slow (libfaketime). `Demand` sends requests to the regions' gateways at chosen rates and logs
every answer with its send and receive times against one clock; `excess` judges a log
against the bound `burst + rate x t`."""

import bisect
import http.client
import os
import threading
import time
from dataclasses import dataclass

import libfaketime

from .netem import FaultProxy
from .stack import ROOT, VALKEY, Process, Stack, free_port, redis_command, wait_for


class World:
    """Regions `names` running `plugin`, each a Stack of one gateway whose bridge knows
    every region; `bridge_args` go to every bridge. With `replica_of` (a region), that
    region's Valkey has a replica, which copies it through a proxy of its own
    (`replication`), and every bridge reaches that region's Redis through a proxy, its own
    bridge included (`link(r, r)`): `fail_over()` moves them all to the replica.
    `clocks[region]`: the rate that region's bridge's clocks run at (1.0: true time), its
    monotonic clock included, which its leases' lives are measured on. `plugins[region]`:
    the plugin that region's gateway loads instead of `plugin`; `listing[region]`: the
    regions that region's bridge names (`--region-redis`), every one by default: bridges
    that disagree, as during a rolling restart that adds a region or moves a home.
    `stack_of(plugin, bridge_args)`: a region's stack of one gateway, if not a plugin's
    (Envoy's `ratelimit` filter and the bridge's rate limit service: `RlsStack`)."""

    def __init__(self, plugin, names=("a", "b", "c"), bridge_args=(), upstream=None,
                 replica_of=None, clocks=None, plugins=None, listing=None, stack_of=None):
        self.names = list(names)
        ports = {n: free_port() for n in self.names}
        # links[(a, b)]: the proxy a's bridge reaches b's Redis through.
        self.links = {}
        proxy_ports = {(a, b): free_port() for a in self.names for b in self.names
                       if a != b or a == replica_of}
        self.regions = {}
        for a in self.names:
            own = proxy_ports.get((a, a), ports[a])
            flags = ["--region", a, "--region-redis", f"{a}=redis://127.0.0.1:{own}"]
            for b in (listing or {}).get(a, self.names):
                if b != a:
                    flags += ["--region-redis", f"{b}=redis://127.0.0.1:{proxy_ports[(a, b)]}"]
            own_plugin, own_args = (plugins or {}).get(a, plugin), [*flags, *bridge_args]
            stack = stack_of(own_plugin, own_args) if stack_of else \
                Stack(own_plugin, gateways=1, bridge_args=own_args, upstream=upstream)
            # The region's Valkey on the port its neighbours' proxies aim at.
            stack.redis_port = ports[a]
            stack.valkey.argv[stack.valkey.argv.index("--port") + 1] = str(ports[a])
            # Its snapshots (a replica's full copy) in its own directory: one left where
            # every test runs would be loaded by the next test's servers, which would then
            # pass for restored from a snapshot.
            stack.valkey.argv += ["--dir", stack.workdir]
            bridge = stack.bridge.argv
            bridge[bridge.index("--redis") + 1] = f"redis://127.0.0.1:{own}"
            if (clocks or {}).get(a, 1.0) != 1.0:
                bridge[0] = DYNAMIC_BRIDGE
                stack.bridge.env.update(clock_running_at(clocks[a]))
            self.regions[a] = stack
        for (a, b), port in proxy_ports.items():
            self.links[(a, b)] = FaultProxy(ports[b], port=port)
        self.replica_of = replica_of
        self.replica = self.replication = None
        if replica_of is not None:
            primary = self.regions[replica_of]
            self.replication = FaultProxy(ports[replica_of])
            self.replica_port = free_port()
            replica_dir = os.path.join(primary.workdir, "replica")
            os.makedirs(replica_dir, exist_ok=True)
            self.replica = Process(f"valkey-{replica_of}-replica", [
                VALKEY, "--port", str(self.replica_port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", replica_dir,
                "--replicaof", "127.0.0.1", str(self.replication.port)],
                primary.workdir)

    def replica_redis(self, *args):
        return redis_command(self.replica_port, *args)

    def replicated(self):
        """Until the replica has everything its primary wrote (bounded wait)."""
        primary = self.regions[self.replica_of]
        wait_for("the replica to catch up", lambda: (
            self.replica_redis("INFO", "replication").get("master_link_status") == "up"
            and primary.redis("INFO", "replication").get("master_repl_offset")
            == self.replica_redis("INFO", "replication").get("slave_repl_offset")))

    def fail_over(self, promoted=lambda: None):
        """The primary of `replica_of` dies (SIGKILL), its replica is promoted (`promoted()`
        runs then, before any bridge reaches it), and every bridge's connection to it moves
        there."""
        self.regions[self.replica_of].valkey.kill()
        self.replica_redis("REPLICAOF", "NO", "ONE")
        promoted()
        for (a, b), proxy in self.links.items():
            if b == self.replica_of:
                proxy.retarget(self.replica_port)
                proxy.reset()

    def link(self, a, b):
        return self.links[(a, b)]

    def links_of(self, region):
        """Every proxy in or out of `region`."""
        return [p for (a, b), p in self.links.items() if region in (a, b)]

    def set_latency(self, rtt_ms):
        for proxy in self.links.values():
            proxy.set(rtt_ms=rtt_ms)

    def cut(self, region, cut=True):
        """`region` cut off from every other region (both ways), or healed."""
        for proxy in self.links_of(region):
            proxy.set(cut=cut)

    def start(self):
        try:
            for proxy in self.links.values():
                proxy.start()
            for stack in self.regions.values():
                stack.start()
            if self.replica is not None:
                self.replication.start()
                self.replica.start()
                self.replicated()
        except Exception:
            self.close()
            raise
        return self

    def close(self):
        for stack in self.regions.values():
            stack.close()
        if self.replica is not None:
            self.replica.stop()
            self.replication.stop()
        for proxy in self.links.values():
            proxy.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *_):
        self.close()


# libfaketime reaches a process through the dynamic loader, which the static bridge of
# dist/ has not: a bridge on a fast or slow clock is the same source's dynamically linked
# dev build, which `cargo test` (and `make test-e2e`) builds.
DYNAMIC_BRIDGE = os.environ.get("RATELIMIT_DYNAMIC_BRIDGE",
                                str(ROOT / "target" / "debug" / "ratelimit-bridge"))


def clock_running_at(rate):
    """The environment that makes a process's clocks, monotonic ones too, run at `rate`
    times true time from its start (libfaketime preloaded; no offset)."""
    _, found = libfaketime.get_reload_information()
    return {"LD_PRELOAD": os.path.join(found["LD_LIBRARY_PATH"], found["LD_PRELOAD"]),
            "FAKETIME": f"+0 x{rate}"}


@dataclass(frozen=True)
class Answer:
    """One request: when it was sent and answered (`time.monotonic`), by which region,
    with what status."""
    sent: float
    done: float
    region: str
    status: int


class Demand:
    """Requests with `headers` to each region's gateway at `rates[region]` per second (open
    loop, one keep-alive connection per worker, `workers` per region), until `stop()`;
    `answers` logs every one against this process's clock."""

    def __init__(self, world, rates, headers, path="/api/global", workers=4):
        self.world, self.path, self.headers = world, path, headers
        self.rates = dict(rates)
        self.answers = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.worker, args=(region, w, workers),
                                         daemon=True)
                        for region in self.world.names for w in range(workers)]

    def set_rates(self, rates):
        self.rates = dict(rates)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=15)
        return self.answers

    def worker(self, region, index, workers):
        """One of `region`'s workers: they take turns, together `rates[region]` a second;
        a change of rate takes effect within 20 ms."""
        port = self.world.regions[region].ports[0]
        conn = None
        last = None
        while not self.stopping.is_set():
            rate = self.rates.get(region, 0)
            if rate <= 0:
                last = None
                self.stopping.wait(0.02)
                continue
            if last is None:
                last = time.monotonic() - workers / rate + index / rate
            due = max(last + workers / rate, time.monotonic() - 1.0)  # never burst
            wait = due - time.monotonic()
            if wait > 0:
                self.stopping.wait(min(wait, 0.02))
                continue
            last = due
            sent, status = time.monotonic(), 0
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", self.path, headers=self.headers)
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                self.answers.append(Answer(sent, time.monotonic(), region, status))
        if conn is not None:
            conn.close()


def admitted(answers):
    return sorted((a for a in answers if a.status == 200), key=lambda a: a.sent)


def excess(answers, burst, rate, window_s):
    """The worst `n - (burst + rate x window_s)` over every window of `window_s` seconds,
    `n` the admissions that surely happened in it (sent at or after its start, answered by
    its end: an admission happened at Redis or a bridge between the two, so a window never
    counts one it may not hold). Sound: a log it finds over the bound broke the bound.

    A window starts at each admission's sending (the i-th in order of sending); `n` is
    those answered by its end less the earlier-sent among them, counted in O(log n): an
    earlier one answered after the end took longer than the window, so only those few are
    looked at."""
    log = admitted(answers)
    dones = sorted(a.done for a in log)
    slow = [(i, a) for i, a in enumerate(log) if a.done - a.sent > window_s]
    slow_index = [i for i, _ in slow]
    slow_sent = [a.sent for _, a in slow]
    longest = max((a.done - a.sent for _, a in slow), default=0.0)
    worst = -(burst + rate * window_s)
    for i, first in enumerate(log):
        end = first.sent + window_s
        lo = bisect.bisect_left(slow_sent, end - longest)
        hi = bisect.bisect_left(slow_index, i)
        late = sum(1 for _, a in slow[lo:hi] if a.done > end)
        n = bisect.bisect_right(dones, end) - (i - late)
        worst = max(worst, n - (burst + rate * window_s))
    return worst


def admitted_rate(answers, start, end):
    """Admissions per second between `start` and `end` (send times)."""
    n = sum(1 for a in answers if a.status == 200 and start <= a.sent < end)
    return n / max(end - start, 1e-9)
