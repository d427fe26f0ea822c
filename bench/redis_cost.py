"""Redis cost per rate-limit check, without Envoy: our token-bucket script against the
patterns of the incumbents, each run on the same Valkey over the same keys.

  script    lua/token_bucket.lua by EVALSHA as the bridge runs it: one call per batch,
            here batches of 1, 8 and 32 checks of one rule each (the rules share their
            parameters, so they are sent once per call as one shape)
  incrby    envoyproxy/ratelimit's fixed window: INCRBY + EXPIRE, pipelined
  getincr   a GET / INCR / EXPIRE / TTL fixed-window script (Higress's pattern)
  naive     HMGET, then MULTI / HSET / EXPIRE / EXEC (the textbook naive bucket:
            two round trips, not atomic across them)

For each: server time of the commands the client sent (INFO commandstats, `usec`) per
rule-check, Redis CPU (INFO cpu, used_cpu_sys + used_cpu_user) normalised to 100k checks,
and MEMORY USAGE of one bucket. The scripts below are written for this bench from the
patterns' public descriptions.

Standalone: `python3 -m bench.redis_cost --port 6379 [--checks N] [--previous FILE
[--previous-takes-mode]]`, where FILE is an older token_bucket.lua taking one check per
call (e.g. from `git show`), run first for comparison.
"""

import argparse
import functools
import time
from pathlib import Path


import valkey

from testbed.stack import ROOT

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


def client(port):
    """A connection to the Valkey on `port` (loopback), replies as bytes."""
    return valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=30)


def pipeline(r, commands):
    """Sends `commands` in one round trip and returns their replies, raising on an error."""
    pipe = r.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute()


def cpu_seconds(info):
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def commandstats(r):
    """{command: (calls, usec)} since the last CONFIG RESETSTAT."""
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in r.info("commandstats").items()}


# One rule of every check: 100 requests per minute, cost 1, no block (burst, num, den,
# cost, after, within, for, lease, shadow; the rest of the shape zeros).
RULE = (100, 1, 600, 1, 0, 0, 0, 0, 0)
# Numbers per rule shape in the script's arguments (protocol/src/script.rs SHAPE_LEN): the
# nine above, an override's burst, num, den and end, a settlement's debt, a slot's life, a
# calendar quota's four period starts.
SHAPE_LEN = 19


def script_args(shape, checks, mode="check"):
    """The script's ARGV for `checks` checks of one rule each, all of `shape` (its first
    numbers; the rest of SHAPE_LEN are zeros): the mode, one shape, the layout (1, 1 per
    check), and no settlement's nor slot's id (docs/token-bucket.md)."""
    padded = (*shape, *(0,) * (SHAPE_LEN - len(shape)))
    return (mode, 1, *padded, b"\x01\x01" * checks, b"")


def run_script(r, checks, prefix, batch=1):
    """The bridge's calls: `batch` checks per EVALSHA, KEYS = their rules' keys, ARGV =
    mode, the rule shapes (one here), then a byte string holding per check its rule count
    and its rules' shapes (here 1, 1 for each check)."""
    sha = r.execute_command("SCRIPT", "LOAD", (ROOT / "lua" / "token_bucket.lua").read_text())
    per_round = max(batch, BATCH // batch * batch)
    for start in range(0, checks, per_round):
        calls = []
        for first in range(start, min(checks, start + per_round), batch):
            n = min(batch, checks - first)
            keys = [f"{prefix}:u{i % KEYS}" for i in range(first, first + n)]
            calls.append(("EVALSHA", sha, n, *keys, *script_args(RULE, n)))
        pipeline(r, calls)
    return ["evalsha"]


def run_previous(r, checks, prefix, text, takes_mode):
    """An older script taking one check per call: KEYS[1], then [mode,] burst, num, den,
    cost (`takes_mode`: the later of those versions took a mode first)."""
    sha = r.execute_command("SCRIPT", "LOAD", text)
    mode = ["check"] if takes_mode else []
    for start in range(0, checks, BATCH):
        pipeline(r, [("EVALSHA", sha, 1, f"{prefix}:u{i % KEYS}", *mode, *RULE[:4])
                    for i in range(start, min(checks, start + BATCH))])
    return ["evalsha"]


def run_incrby(r, checks, prefix):
    window = int(time.time()) // 60 * 60
    for start in range(0, checks, BATCH):
        cmds = []
        for i in range(start, min(checks, start + BATCH)):
            key = f"{prefix}:u{i % KEYS}_{window}"
            cmds += [("INCRBY", key, 1), ("EXPIRE", key, 60)]
        pipeline(r, cmds)
    return ["incrby", "expire"]


def run_getincr(r, checks, prefix):
    sha = r.execute_command("SCRIPT", "LOAD", GETINCR_LUA)
    for start in range(0, checks, BATCH):
        pipeline(r, [("EVALSHA", sha, 1, f"{prefix}:u{i % KEYS}", 100, 60)
                    for i in range(start, min(checks, start + BATCH))])
    return ["evalsha"]


def run_naive(r, checks, prefix):
    rate_per_ms, burst = 100 / 60000, 100.0
    for start in range(0, checks, BATCH):
        keys = [f"{prefix}:u{i % KEYS}" for i in range(start, min(checks, start + BATCH))]
        states = pipeline(r, [("HMGET", k, "tokens", "ts") for k in keys])
        now = time.time() * 1000
        writes = []
        for key, (tokens, ts) in zip(keys, states):
            level = burst if tokens is None else min(
                burst, float(tokens) + (now - float(ts)) * rate_per_ms)
            level = level - 1 if level >= 1 else level
            writes += [("MULTI",), ("HSET", key, "tokens", f"{level:.6f}", "ts", f"{now:.0f}"),
                       ("EXPIRE", key, 60), ("EXEC",)]
        pipeline(r, writes)
    return ["hmget", "multi", "exec"]


BATCH_SIZES = (1, 8, 32)

PATTERNS = [
    (f"script{'' if n == 1 else n}",
     f"ours: token_bucket.lua, {n} check{'s' if n > 1 else ''} per call "
     "(EVALSHA; TIME, MGET, SET or MSETEX inside)",
     functools.partial(run_script, batch=n))
    for n in BATCH_SIZES
] + [
    ("incrby", "envoyproxy/ratelimit: INCRBY + EXPIRE pipeline (fixed window)", run_incrby),
    ("getincr", "Higress: GET/INCR/EXPIRE/TTL script (fixed window)", run_getincr),
    ("naive", "naive: HMGET, then MULTI/HSET/EXPIRE/EXEC", run_naive),
]


def measure(port, checks, previous=None, previous_takes_mode=False):
    """Runs every pattern for `checks` checks; returns one result dict per pattern
    (`usec_per_check` is per rule-check: each check here has one rule). `previous`: the
    text of an older one-check-per-call script, measured first."""
    patterns = list(PATTERNS)
    if previous is not None:
        patterns.insert(0, ("previous", "previous token_bucket.lua, 1 check per call",
                            functools.partial(run_previous, text=previous,
                                              takes_mode=previous_takes_mode)))
    r = client(port)
    results = []
    try:
        for name, label, run in patterns:
            prefix = f"cost:{name}"
            r.execute_command("CONFIG", "RESETSTAT")
            cpu0 = cpu_seconds(r.info("cpu"))
            t0 = time.monotonic()
            top_level = run(r, checks, prefix)
            wall = time.monotonic() - t0
            cpu = cpu_seconds(r.info("cpu")) - cpu0
            stats = commandstats(r)
            usec = sum(stats.get(c, (0, 0))[1] for c in top_level)
            calls = sum(stats.get(c, (0, 0))[0] for c in top_level)
            sample = r.execute_command("SCAN", 0, "MATCH", f"{prefix}:*", "COUNT", 1000)[1][:50]
            sizes = [r.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0") for k in sample]
            results.append({
                "pattern": name, "label": label, "checks": checks,
                "usec_per_check": usec / checks,
                "cpu_s_per_100k": cpu * 100_000 / checks,
                "bytes_per_bucket": sum(sizes) / len(sizes) if sizes else 0,
                "client_checks_per_s": checks / wall,
                "top_level_commands": top_level, "top_level_calls": calls,
                "commandstats": {k: {"calls": c, "usec": u} for k, (c, u) in stats.items()},
            })
    finally:
        r.close()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="a Valkey on 127.0.0.1")
    parser.add_argument("--checks", type=int, default=100_000)
    parser.add_argument("--previous", type=Path, help="an older one-check-per-call script")
    parser.add_argument("--previous-takes-mode", action="store_true",
                        help="the --previous script takes a mode ('check') before its numbers")
    args = parser.parse_args()
    previous = args.previous.read_text() if args.previous else None
    for row in measure(args.port, args.checks, previous, args.previous_takes_mode):
        print(f"{row['usec_per_check']:7.2f} µs/rule-check  {row['cpu_s_per_100k']:5.2f} CPU s/100k  "
              f"{row['bytes_per_bucket']:4.0f} B  {row['label']}")


if __name__ == "__main__":
    main()
