"""`make soak`: the proof of robustness, which the unit and end-to-end tests cannot give in
seconds. Steady load runs through two Envoy gateways for many minutes while the backend is
broken on purpose, in three scenarios one after the other:

  single   one Valkey, one bridge: Valkey stopped and started again on its port; the
           bridge killed with SIGKILL and started again
  cluster  a Valkey Cluster of 3 primaries with a replica each, a bridge with --cluster:
           a primary killed with SIGKILL (its replica takes over, the old primary rejoins
           as the new one's replica); the bridge killed with SIGKILL and started again
  attacked the faults of `single`, while the security reviews' attacks run all along
           (testbed/attacks.py): every bridge connection slot held by unauthenticated
           peers that never read, 20 token-holding gRPC streams that never read their
           replies, fresh clients filling a Valkey of `maxmemory` 2mb (volatile-ttl)
           with keys, and a metered client trying every way of paying less than it
           consumes of an LLM upstream behind /v1/; the steady load is held to the same
           checks, and the metered client to its bound

and checks, from every request's send time, latency and status placed against the fault
windows:

  * outside the windows and their recovery grace (GRACE_S) every answer is 200; inside,
    200 or the 503 of `failure_mode: closed`, never anything else (no dropped connection);
  * limiting is exact after every recovery: a fresh client of the probe rule gets exactly
    its burst across both gateways, then 429;
  * resident memory (VmRSS) of each gateway, the bridge and Valkey stays flat: after a
    warm-up, the median of the last quarter of a process's samples is within
    RSS_TOLERANCE (or RSS_SLACK_KIB) of the first quarter's;
  * (attacked) what the upstream consumed for the metered client, in each epoch between
    Valkey restarts, is within B + r x t + N x (C - R) (metering.py).

Prints the report and writes it to testbed/SOAK.md (--out); exits 1 when a check fails,
keeping the logs, the per-request records and the memory samples. The load comes from Python threads on
keep-alive connections rather than bench's loadgen, which keeps only a summary: the soak
needs each request's time and status. Every process is a stack.Process, stopped on
success, failure, Ctrl-C or SIGTERM.

Layout, in the order a run goes through it:

  __main__.py  the command line (`python -m testbed.soak`, `make soak`)
  settings.py  the numbers: load, probe, fault spacing, grace, memory tolerance, plugin
  run.py       one scenario: its stack started, load, sampler and chaos run, all stopped
  load.py      the steady load (Load) and a single request (get_status)
  memory.py    VmRSS sampled per process lifetime (RssSampler), and its trend
  faults.py    the faults, the scenarios (SCENARIOS) and the schedule (chaos)
  metering.py  the metering abuser's bound, epoch by epoch (judge)
  analysis.py  each request placed against the fault windows; the checks
  report.py    testbed/SOAK.md
"""
