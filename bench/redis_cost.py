"""Redis cost per rate-limit check, without Envoy: our token-bucket script against the
patterns of the incumbents, each run on the same Valkey over the same keys.

  script    lua/token_bucket.lua by EVALSHA (what the bridge runs): one call per check
  incrby    envoyproxy/ratelimit's fixed window: INCRBY + EXPIRE, pipelined
  getincr   a GET / INCR / EXPIRE / TTL fixed-window script (Higress's pattern)
  naive     HMGET, then MULTI / HSET / EXPIRE / EXEC (the design study's naive bucket:
            two round trips, not atomic across them)

For each: server time of the commands the client sent (INFO commandstats, `usec`), Redis
CPU (INFO cpu, used_cpu_sys + used_cpu_user) normalised to 100k checks, and MEMORY USAGE
of one bucket. The scripts below are written for this bench from the patterns' public
descriptions.
"""

import socket
import time

from stack import ROOT

KEYS = 10_000
BATCH = 100

GETINCR_LUA = """
local limit = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current >= limit then
  return {0, 0, redis.call('TTL', KEYS[1])}
end
current = redis.call('INCR', KEYS[1])
if current == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return {1, limit - current, redis.call('TTL', KEYS[1])}
"""


class Resp:
    """A minimal pipelining RESP2 client (loopback only)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.file = self.sock.makefile("rb")

    def close(self):
        self.file.close()
        self.sock.close()

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"bad RESP reply {line!r}")

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        replies = [self.read() for _ in commands]
        for r in replies:
            if isinstance(r, RuntimeError):
                raise r
        return replies

    def call(self, *args):
        return self.pipeline([args])[0]

    def info(self, section):
        text = self.call("INFO", section).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def cpu_seconds(info):
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def commandstats(r):
    """{command: (calls, usec)} since the last CONFIG RESETSTAT."""
    stats = {}
    for name, value in r.info("commandstats").items():
        fields = dict(kv.split("=", 1) for kv in value.split(","))
        stats[name.removeprefix("cmdstat_")] = (int(fields["calls"]), int(fields["usec"]))
    return stats


def script_mode(text):
    """The leading arguments of the script: newer versions take a mode ('check' or
    'refund') in ARGV[1] before the rules."""
    return ["check"] if "'check'" in text else []


def run_script(r, checks, prefix):
    text = (ROOT / "lua" / "token_bucket.lua").read_text()
    sha, mode = r.call("SCRIPT", "LOAD", text), script_mode(text)
    for start in range(0, checks, BATCH):
        # 100 requests per minute per key, cost 1: (key, burst, num, den, cost).
        r.pipeline([("EVALSHA", sha, 1, f"{prefix}:u{i % KEYS}", *mode, 100, 1, 600, 1)
                    for i in range(start, min(checks, start + BATCH))])
    return ["evalsha"]


def run_incrby(r, checks, prefix):
    window = int(time.time()) // 60 * 60
    for start in range(0, checks, BATCH):
        cmds = []
        for i in range(start, min(checks, start + BATCH)):
            key = f"{prefix}:u{i % KEYS}_{window}"
            cmds += [("INCRBY", key, 1), ("EXPIRE", key, 60)]
        r.pipeline(cmds)
    return ["incrby", "expire"]


def run_getincr(r, checks, prefix):
    sha = r.call("SCRIPT", "LOAD", GETINCR_LUA)
    for start in range(0, checks, BATCH):
        r.pipeline([("EVALSHA", sha, 1, f"{prefix}:u{i % KEYS}", 100, 60)
                    for i in range(start, min(checks, start + BATCH))])
    return ["evalsha"]


def run_naive(r, checks, prefix):
    rate_per_ms, burst = 100 / 60000, 100.0
    for start in range(0, checks, BATCH):
        keys = [f"{prefix}:u{i % KEYS}" for i in range(start, min(checks, start + BATCH))]
        states = r.pipeline([("HMGET", k, "tokens", "ts") for k in keys])
        now = time.time() * 1000
        writes = []
        for key, (tokens, ts) in zip(keys, states):
            level = burst if tokens is None else min(
                burst, float(tokens) + (now - float(ts)) * rate_per_ms)
            level = level - 1 if level >= 1 else level
            writes += [("MULTI",), ("HSET", key, "tokens", f"{level:.6f}", "ts", f"{now:.0f}"),
                       ("EXPIRE", key, 60), ("EXEC",)]
        r.pipeline(writes)
    return ["hmget", "multi", "exec"]


PATTERNS = [
    ("script", "ours: token_bucket.lua (EVALSHA; TIME, MGET, SET inside)", run_script),
    ("incrby", "envoyproxy/ratelimit: INCRBY + EXPIRE pipeline (fixed window)", run_incrby),
    ("getincr", "Higress: GET/INCR/EXPIRE/TTL script (fixed window)", run_getincr),
    ("naive", "naive: HMGET, then MULTI/HSET/EXPIRE/EXEC", run_naive),
]


def measure(port, checks):
    """Runs every pattern for `checks` checks; returns one result dict per pattern."""
    r = Resp(port)
    results = []
    try:
        for name, label, run in PATTERNS:
            prefix = f"cost:{name}"
            r.call("CONFIG", "RESETSTAT")
            cpu0 = cpu_seconds(r.info("cpu"))
            t0 = time.monotonic()
            top_level = run(r, checks, prefix)
            wall = time.monotonic() - t0
            cpu = cpu_seconds(r.info("cpu")) - cpu0
            stats = commandstats(r)
            usec = sum(stats.get(c, (0, 0))[1] for c in top_level)
            sample = r.call("SCAN", 0, "MATCH", f"{prefix}:*", "COUNT", 1000)[1][:50]
            sizes = [r.call("MEMORY", "USAGE", k, "SAMPLES", "0") for k in sample]
            results.append({
                "pattern": name, "label": label, "checks": checks,
                "usec_per_check": usec / checks,
                "cpu_s_per_100k": cpu * 100_000 / checks,
                "bytes_per_bucket": sum(sizes) / len(sizes) if sizes else 0,
                "client_checks_per_s": checks / wall,
                "top_level_commands": top_level,
                "commandstats": {k: {"calls": c, "usec": u} for k, (c, u) in stats.items()},
            })
    finally:
        r.close()
    return results
