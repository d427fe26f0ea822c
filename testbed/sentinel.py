"""A replicated Valkey watched by Redis Sentinels, on loopback for tests: a primary, its
replicas and three sentinels (quorum 2) on free ports. Each sentinel rewrites its own
configuration file (it records what it learns), so each gets one of its own; each data
node has its own directory, as a replica stores the copy it syncs there."""

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import valkey

from .stack import VALKEY, Process, free_port, redis_command, wait_for

NAME = "mymaster"


class DataNode:
    def __init__(self, workdir, name, primary=None):
        self.port = free_port()
        self.dir = Path(workdir) / name
        self.dir.mkdir()
        replicaof = ["--replicaof", "127.0.0.1", str(primary.port)] if primary else []
        self.process = Process(name, [
            VALKEY, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--appendonly", "no", *replicaof], workdir)

    def cmd(self, *args):
        return redis_command(self.port, *args)

    def role(self):
        return self.cmd("ROLE")[0]

    def alive(self):
        return self.process.proc is not None and self.process.proc.poll() is None


class SentinelGroup:
    """`start()` returns once every sentinel knows the master, all its replicas and the
    other sentinels, so a failover can begin as soon as the master fails."""

    def __init__(self, replicas=2, down_after_ms=1000, failover_timeout_ms=5000):
        self.workdir = tempfile.mkdtemp(prefix="ratelimit-sentinel-")
        self.primary = DataNode(self.workdir, "primary")
        self.replicas = [DataNode(self.workdir, f"replica-{i}", self.primary)
                         for i in range(replicas)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels = []
        for i, port in enumerate(self.sentinel_ports):
            conf = Path(self.workdir) / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {NAME} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {NAME} {down_after_ms}\n"
                f"sentinel failover-timeout {NAME} {failover_timeout_ms}\n")
            self.sentinels.append(Process(f"sentinel-{i}", [VALKEY, str(conf), "--sentinel"],
                                          self.workdir))

    @property
    def nodes(self):
        return [self.primary, *self.replicas]

    def bridge_args(self):
        """The bridge's flags for this group: every sentinel."""
        urls = ",".join(f"redis://127.0.0.1:{p}" for p in self.sentinel_ports)
        return ["--sentinel", NAME, "--redis", urls]

    def start(self):
        try:
            for n in self.nodes:
                n.process.start()
            for n in self.nodes:
                wait_for(n.process.name, lambda n=n: n.cmd("PING"), proc=n.process.proc,
                         log=n.process.log)
            wait_for("replicas in sync", lambda: all(
                r.cmd("ROLE")[3] == "connected" for r in self.replicas))
            for s in self.sentinels:
                s.start()
            wait_for("every sentinel to know the group", self.known, timeout=60)
        except Exception:
            self.close()
            raise
        return self

    def sentinel(self, i, *args):
        return redis_command(self.sentinel_ports[i], *args)

    def known(self):
        for i in range(len(self.sentinels)):
            fields = self.sentinel(i, "SENTINEL", "MASTER", NAME)
            if isinstance(fields, list):
                fields = dict(zip(fields[::2], fields[1::2]))
            if (fields["flags"], int(fields["num-slaves"]), int(fields["num-other-sentinels"])) \
                    != ("master", len(self.replicas), len(self.sentinels) - 1):
                return False
        return True

    def master(self):
        """The data node most sentinels name as the master now."""
        named = Counter()
        for i in range(len(self.sentinels)):
            try:
                _, port = self.sentinel(i, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME)
                named[int(port)] += 1
            except (valkey.ValkeyError, TypeError, ValueError):
                continue
        port = named.most_common(1)[0][0]
        return next(n for n in self.nodes if n.port == port)

    def close(self):
        for p in [*self.sentinels, *(n.process for n in self.nodes)]:
            p.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
