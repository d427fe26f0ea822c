"""The soak's numbers in one place: how much load, which probe, how faults are spaced, how
long recovery may take, how flat memory must stay, and the plugin configuration the
gateways run. The load, the faults, the analysis and the report all read them, and the
report quotes them, so that what SOAK.md says is what the run did."""

# Steady load: bounded, loopback only. 1000 users at 300 requests/s is 0.3 per user and
# second, far under their 1000 per minute: the steady load is never denied.
RATE = 300.0
WORKERS = 16
USERS = 1000
PATH = "/api/soak"
REQUEST_TIMEOUT_S = 10.0
# The probe of exact limiting: a fresh client per probe, this burst per hour.
PROBE_BURST = 20
PROBE_EXTRA = 5
EXPECTED_PROBE = [200] * PROBE_BURST + [429] * PROBE_EXTRA

# Faults: about one every FAULT_SPACING_S, kinds alternating, never sooner than
# MIN_STEADY_S after limiting resumed from the previous one.
FAULT_SPACING_S = 30.0
MIN_STEADY_S = 3.0
VALKEY_DOWN_S = 3.0
BRIDGE_DOWN_S = 2.0
REJOIN_AFTER_S = 3.0  # a killed primary restarts this long after its replica took over
RECOVERY_TIMEOUT_S = 60.0
# After a component is back, answers may still be 503 for a while: the filter reopens its
# gRPC stream with a backoff that doubles up to 5 s, and the breaker (below) stays open up
# to 2 s. Past this grace, anything but 200 is a failure.
GRACE_S = 10.0

# Memory: sampled every SAMPLE_EVERY_S; the first fifth of a process's samples is its
# warm-up; judged when at least RSS_MIN_SAMPLES remain.
SAMPLE_EVERY_S = 2.0
RSS_TOLERANCE = 0.20
RSS_SLACK_KIB = 4096
RSS_MIN_SAMPLES = 8

BREAKER = {"failures": 5, "open_ms": 200, "max_open_ms": 2000}
PLUGIN = {
    # A generous timeout: the soak is about faults, not about latency on a shared machine.
    "backend": {"cluster": "ratelimit_bridge", "timeout_ms": 1000},
    "failure_mode": "closed",
    "circuit_breaker": BREAKER,
    "identity": {"user": {"header": "x-user-id"}, "probe": {"header": "x-probe-id"}},
    "rules": [
        {"name": "per-user", "key": ["user"], "limit": {"requests": 1000, "per": "1m"}},
        {"name": "probe", "key": ["probe"], "limit": {"requests": PROBE_BURST, "per": "1h"}},
    ],
}
# The attacked scenario: the gateways' token; the bridge's slots, all held by the attackers;
# fresh clients of their own rule (10 per hour: each key lives minutes), filling a Valkey
# whose maxmemory a few thousand of them exceed.
TOKEN = "soak-gateways-token"
ATTACK_SLOTS = 256
FRESH_RATE = 200.0
FRESH_PATH = "/api/fresh"
VALKEY_MEMORY = ["--maxmemory", "2mb", "--maxmemory-policy", "volatile-ttl"]


# The metering abuser (fourth review): an LLM API behind /v1/ (testbed/llm_upstream.py),
# 2,000 tokens an hour per API key, prompt x1 and completion x4, reserving the body's
# max_tokens (default 100, at most the burst). Its requests, at most 8 in flight, cost
# the upstream 600 tokens each, or 1,004 for those reserving 1 token.
LLM_PREFIX = "/v1/"
LLM_PATH = "/v1/chat/completions"
LLM_KEY = "abuser"
LLM_BURST = 2000
LLM_PER_S = 3600
LLM_WEIGHTS = {"prompt": 1, "completion": 4}
LLM_PARALLEL = 8
LLM_MOST = 1004
LLM_LEAST = 1
LLM_RULE = {"name": "llm", "key": ["api_key"], "match": {"path_prefix": LLM_PREFIX},
            "limit": {"requests": LLM_BURST, "per": f"{LLM_PER_S}s"},
            "meter": {"body": {"usage.prompt_tokens": LLM_WEIGHTS["prompt"],
                               "usage.completion_tokens": LLM_WEIGHTS["completion"]},
                      "reserve": {"body": ["max_tokens"], "default": 100, "max": LLM_BURST}}}


def attacked_plugin():
    plugin = {**PLUGIN, "backend": {**PLUGIN["backend"], "token": TOKEN},
              "identity": {**PLUGIN["identity"], "fresh": {"header": "x-fresh-id"},
                           "api_key": {"header": "x-api-key"}}}
    plugin["rules"] = PLUGIN["rules"] + [
        {"name": "fresh", "key": ["fresh"], "match": {"path": FRESH_PATH},
         "limit": {"requests": 10, "per": "1h"}},
        LLM_RULE]
    return plugin


# What a steady-load request may be answered, by where it falls.
ALLOWED = {"outage": {200, 503}, "grace": {200, 503}, "steady": {200}}
