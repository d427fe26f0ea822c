#!/usr/bin/env python3
"""`make demo`: one Valkey, one bridge, two Envoy gateways; scripted traffic through both
shows per-user, per-IP and global limits holding across gateways, then everything stops."""

import json
import sys

from .stack import Stack

PLUGIN = {
    "backend": {"cluster": "ratelimit_bridge", "timeout_ms": 250},
    "failure_mode": "closed",
    "identity": {"user": {"header": "x-user-id"}, "ip": {"source": "peer"}},
    "rules": [
        {"name": "per-user", "key": ["user"], "match": {"path_prefix": "/api/"},
         "limit": {"requests": 10, "per": "1m"}},
        {"name": "search-per-ip", "key": ["ip"],
         "match": {"path_prefix": "/search", "methods": ["GET"]},
         "limit": {"requests": 5, "per": "1m"}},
        {"name": "global", "key": [], "match": {"path_prefix": "/public"},
         "limit": {"requests": 20, "per": "1m"}},
    ],
}

# (scenario, limit, requests as (path, headers, source address))
SCENARIOS = [
    ("per-user: alice, 10/min", 10,
     [("/api/feed", {"x-user-id": "alice"}, None)] * 16),
    ("per-IP: 127.0.0.7 searches, 5/min", 5,
     [("/search?q=cats", {}, "127.0.0.7")] * 9),
    ("global: 30 anonymous clients, 20/min", 20,
     [("/public/page", {}, f"127.0.1.{i}") for i in range(30)]),
]


def main():
    print("starting Valkey, ratelimit-bridge and two Envoy gateways ...", flush=True)
    stack = Stack(PLUGIN, gateways=2).start()
    failed = False
    sample = None
    try:
        rows = []
        for name, limit, requests in SCENARIOS:
            admitted = [0, 0]
            denied = 0
            for n, (path, headers, source) in enumerate(requests):
                gateway = n % 2  # alternate: the buckets are shared
                status, resp_headers, body = stack.get(gateway, path, headers, source=source)
                if status == 200:
                    admitted[gateway] += 1
                elif status == 429:
                    denied += 1
                    sample = sample or (resp_headers, body)
                else:
                    raise RuntimeError(f"unexpected HTTP {status}: {body}")
            ok = sum(admitted) == limit
            failed |= not ok
            rows.append((name, limit, len(requests), admitted[0], admitted[1], sum(admitted),
                         denied, "ok" if ok else "WRONG"))
        header = ("scenario", "limit", "sent", "gw0 ok", "gw1 ok", "admitted", "429", "")
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        print()
        for r in [header, *rows]:
            print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
        if sample:
            headers, body = sample
            print("\na 429 as clients see it:")
            for h in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
                      "retry-after", "content-type"):
                print(f"  {h}: {headers.get(h)}")
            print(f"  {json.dumps(json.loads(body))}")
    finally:
        stack.close()
        print("\nstopped everything.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
