"""Redis memory per bucket key: what one client costs a Redis that holds the buckets, for
the sizing rule of docs/operations.md, "Redis memory" (keys = distinct active clients x rules).

For each kind of key, writes KEYS fresh buckets with lua/token_bucket.lua itself (EVALSHA,
one check of one rule per key, batches as the bridge sends them), then reports the mean
`MEMORY USAGE key SAMPLES 0` of a sample and the growth of INFO memory's `used_memory`
per 10,000 keys (which also counts the keyspace's and the expiry table's share: every
bucket has a TTL). Each kind runs on an emptied server (FLUSHALL) so the dict sizes start
alike.

Standalone: `python3 -m bench.key_memory --port 6379 [--keys 100000]` on a Valkey that
holds nothing you need (it is flushed).
"""

import argparse
import json

from testbed.stack import ROOT

from .redis_cost import client, pipeline, script_args

# (name, how a gateway makes the key, shape): burst, num, den, cost, after, within, for,
# lease, shadow. 100 per day, so that a bucket one token short lives 865 s (until it is
# full again, plus a second), longer than the run; `login` (5 per day) blocks (after 5
# denials within 1 min, for 15 min), so its bucket is the 49-byte form.
PER_DAY = (100, 1, 864000, 1, 0, 0, 0, 0, 0)
KINDS = [
    ("user id (8 chars)", lambda i: f"rl:per-user:u{i:07d}", PER_DAY),
    ("IPv4 address", lambda i: f"rl:per-ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
     PER_DAY),
    ("IPv6 /64", lambda i: f"rl:per-ip:2001%3Adb8%3A{i:x}%3A2%3A%3A%2F64", PER_DAY),
    ("digested value (#sha256)", lambda i: f"rl:per-key:#{i:064x}", PER_DAY),
    ("user id, rule with block", lambda i: f"rl:login:u{i:07d}",
     (5, 1, 17280000, 1, 5, 60000, 900000, 0, 0)),
]
BATCH = 256


def fill(r, sha, keys, shape):
    for start in range(0, len(keys), BATCH * 8):
        calls = []
        for first in range(start, min(len(keys), start + BATCH * 8), BATCH):
            batch = keys[first:first + BATCH]
            calls.append(("EVALSHA", sha, len(batch), *batch, *script_args(shape, len(batch))))
        pipeline(r, calls)


def measure(port, n):
    r = client(port)
    results = []
    try:
        info = r.info("server")
        sha = r.execute_command("SCRIPT", "LOAD", (ROOT / "lua" / "token_bucket.lua").read_text())
        for name, make, shape in KINDS:
            r.execute_command("FLUSHALL", "SYNC")
            before = int(r.info("memory")["used_memory"])
            keys = [make(i) for i in range(n)]
            fill(r, sha, keys, shape)
            grown = int(r.info("memory")["used_memory"]) - before
            assert r.dbsize() == n, (name, r.dbsize())
            sample = keys[:: max(1, n // 200)]
            usage = [r.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0") for k in sample]
            results.append({
                "kind": name, "example": keys[0], "key_bytes": len(keys[0]),
                "value_bytes": len(r.get(keys[0])),
                "memory_usage_bytes": sum(usage) / len(usage),
                "used_memory_per_key": grown / n,
                "used_memory_per_10k_keys": grown * 10_000 / n,
            })
        r.execute_command("FLUSHALL", "SYNC")
    finally:
        r.close()
    server = {k: info.get(k) for k in ("valkey_version", "redis_version", "server_name")}
    return {"server": server, "keys": n, "kinds": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="a Valkey on 127.0.0.1")
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.port, args.keys), indent=1))


if __name__ == "__main__":
    main()
