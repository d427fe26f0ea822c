"""A Valkey Cluster on loopback for tests: N primaries, each with R replicas, created with
CLUSTER MEET / ADDSLOTSRANGE / REPLICATE (no valkey-cli needed), on free ports."""

import shutil
import tempfile
import time
from pathlib import Path

import valkey

from .stack import VALKEY, Process, free_port, wait_for

SLOTS = 16384


class Node:
    def __init__(self, workdir, name, node_timeout_ms):
        self.port, self.bus_port = free_port(), free_port()
        self.dir = Path(workdir) / name
        self.dir.mkdir()
        self.process = Process(name, [
            VALKEY, "--port", str(self.port), "--cluster-port", str(self.bus_port),
            "--bind", "127.0.0.1", "--dir", str(self.dir), "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms),
            "--save", "", "--appendonly", "no"], workdir)

    def restart(self):
        """Starts the node again on its ports with its nodes.conf, after a stop or a kill:
        it rejoins the cluster (a primary that was failed over comes back as a replica of
        the node that took its slots)."""
        self.process.start()
        wait_for(self.process.name, lambda: self.cmd("PING"), proc=self.process.proc, log=self.process.log)

    def client(self):
        return valkey.Valkey(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def cmd(self, *args):
        return self.client().execute_command(*args)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def alive(self):
        return self.process.proc is not None and self.process.proc.poll() is None


class ValkeyCluster:
    def __init__(self, primaries=3, replicas=0, node_timeout_ms=1000):
        self.workdir = tempfile.mkdtemp(prefix="ratelimit-cluster-")
        self.primaries = [Node(self.workdir, f"primary-{i}", node_timeout_ms) for i in range(primaries)]
        self.replicas = [Node(self.workdir, f"replica-{i}-{j}", node_timeout_ms)
                         for i in range(primaries) for j in range(replicas)]
        self.replicas_per_primary = replicas

    @property
    def nodes(self):
        return self.primaries + self.replicas

    def seeds(self):
        return ",".join(n.url for n in self.primaries)

    def bridge_args(self):
        """The bridge's flags for this cluster."""
        return ["--cluster", "--redis", self.seeds()]

    def start(self):
        try:
            for n in self.nodes:
                n.process.start()
            for n in self.nodes:
                wait_for(n.process.name, lambda n=n: n.cmd("PING"), proc=n.process.proc, log=n.process.log)
            first = self.nodes[0]
            for n in self.nodes[1:]:
                n.cmd("CLUSTER", "MEET", "127.0.0.1", first.port, first.bus_port)
            per = SLOTS // len(self.primaries)
            for i, p in enumerate(self.primaries):
                last = SLOTS - 1 if i == len(self.primaries) - 1 else (i + 1) * per - 1
                p.cmd("CLUSTER", "ADDSLOTSRANGE", i * per, last)
            ids = [p.cmd("CLUSTER", "MYID") for p in self.primaries]
            for k, r in enumerate(self.replicas):
                primary_id = ids[k // self.replicas_per_primary]
                wait_for("replica to learn its primary",
                         lambda r=r, pid=primary_id: pid in r.cmd("CLUSTER", "NODES"))
                r.cmd("CLUSTER", "REPLICATE", primary_id)
            wait_for("cluster state ok", self.healthy, timeout=60)
        except Exception:
            self.close()
            raise
        return self

    def healthy(self):
        live = [n for n in self.nodes if n.alive()]
        return all("cluster_state:ok" in n.cmd("CLUSTER", "INFO") for n in live) and \
            all(len(self.slot_owners(n)) == SLOTS for n in live)

    def slot_owners(self, node):
        """slot -> port of the primary serving it, as `node` sees the cluster."""
        owners = {}
        for start, end, primary, *_ in node.cmd("CLUSTER", "SLOTS"):
            for s in range(int(start), int(end) + 1):
                owners[s] = int(primary[1])
        return owners

    def node_of(self, key):
        """The live primary serving `key` now."""
        live = next(n for n in self.nodes if n.alive())
        port = self.slot_owners(live)[int(live.cmd("CLUSTER", "KEYSLOT", key))]
        return next(n for n in self.nodes if n.port == port)

    def move_slot(self, slot, source, target, pause_s=0.0):
        """Moves `slot` from primary `source` to `target` as `valkey-cli --cluster reshard`
        does: the target IMPORTING, the source MIGRATING, its keys MIGRATEd a few at a
        time, then SETSLOT NODE on every primary. `pause_s` holds the slot half-moved (its
        keys on the target, the source still owning it) for that long."""
        source_id, target_id = source.cmd("CLUSTER", "MYID"), target.cmd("CLUSTER", "MYID")
        target.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := source.cmd("CLUSTER", "GETKEYSINSLOT", slot, 10):
            source.cmd("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        time.sleep(pause_s)
        for node in [target, source] + [p for p in self.primaries if p not in (source, target)]:
            node.cmd("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def close(self):
        for n in self.nodes:
            n.process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
