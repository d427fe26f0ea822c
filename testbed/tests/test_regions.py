"""Global rules across three regions on one machine (testbed/regions.py: per region a Valkey,
a bridge and an Envoy; every cross-region connection through a fault-injecting proxy), short
forms of docs/regions.md's cases; the soak runs the long ones. Every answer is logged against
one clock and `excess` judges the log against `burst + rate x t` for windows of 0.1, 1 and 5
s: a sound count (an admission counts in a window only if it surely happened in it), so any
excess above 0 is a broken bound. The negative controls run on the same rig and must be
caught: three independent buckets, and regions exchanging their counts asynchronously."""

import hashlib
import json
import random
import subprocess
import threading
import time

import pytest

from testbed.plugins import plugin, rule
from testbed.client import request
from testbed.native_ratelimit import RlsStack
from testbed.regions import Answer, Demand, World, admitted, admitted_rate, excess
from testbed.stack import BRIDGE

RATE = 20  # a second, and the burst
TTL_MS = 500
WINDOWS = (0.1, 1, 5)
KEY = {"x-api-key": "tenant-1"}


def config(share=None, home=None, global_=True, burst=RATE, ttl_ms=TTL_MS):
    r = rule("tenant", ["api_key"], RATE, per="1s")
    r["limit"]["burst"] = burst
    if global_:
        terms = {"lease_ttl": f"{ttl_ms}ms"} if ttl_ms else {}
        if share:
            terms["partition"] = {"share": share}
        if home:
            terms["home"] = home
        r["global"] = terms
    return plugin(r, identity={"api_key": {"header": "x-api-key"}}, timeout_ms=2000)


def test_the_checker_counts_what_the_definition_counts():
    """`excess` counts in O(log n) per window; on random logs (ties, answers slower than
    the window, denials) it finds what counting every window by the definition finds."""
    def by_definition(answers, burst, rate, w):
        log = admitted(answers)
        return max([sum(1 for a in log[i:] if a.done <= f.sent + w) - (burst + rate * w)
                    for i, f in enumerate(log)], default=-(burst + rate * w))

    rng = random.Random(39)
    for _ in range(200):
        answers = []
        for _ in range(rng.randint(0, 120)):
            sent = round(rng.uniform(0, 10), 2)
            took = rng.choice([0.001, 0.2, 1.5, rng.uniform(0, 3)])
            answers.append(Answer(sent, sent + took, "a", rng.choice([200, 200, 429])))
        for w in (0.1, 1, 5):
            assert excess(answers, 5, 3, w) == pytest.approx(by_definition(answers, 5, 3, w))


@pytest.fixture
def world_of():
    made = []

    def make(plugin_, **options):
        world = World(plugin_, **options)
        made.append(world)
        world.start()
        time.sleep(1.1)  # past the ledgers' learning on a fresh server
        return world

    yield make
    for world in made:
        world.close()


def run(world, rates, seconds, script=(), headers=KEY):
    """Demand at `rates` for `seconds`; `script`: (at seconds, action(world, demand)) done
    on the way. Returns (answers, start)."""
    demand = Demand(world, rates, headers).start()
    start = time.monotonic()
    for at, action in script:
        time.sleep(max(0.0, start + at - time.monotonic()))
        action(world, demand)
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    return demand.stop(), start


def within_bound(answers, burst=RATE):
    worst = {w: excess(answers, burst, RATE, w) for w in WINDOWS}
    assert all(e <= 0 for e in worst.values()), f"over the bound: {worst}"
    return worst


UNIFORM = {"a": RATE, "b": RATE, "c": RATE}
NINETY_TEN = {"a": 2.7 * RATE, "b": 0.15 * RATE, "c": 0.15 * RATE}


@pytest.mark.parametrize("rtt_ms,rates,moving", [
    (0, UNIFORM, False), (40, NINETY_TEN, False), (150, UNIFORM, False), (150, NINETY_TEN, True)])
def test_three_times_the_rate_in_three_regions_keeps_one_budget(world_of, rtt_ms, rates, moving):
    world = world_of(config())
    world.set_latency(rtt_ms)
    script = []
    if moving:
        # The hotspot moves every 2 s.
        for at, hot in ((2, "b"), (4, "c")):
            shifted = {r: (2.7 if r == hot else 0.15) * RATE for r in world.names}
            script.append((at, lambda _w, d, s=shifted: d.set_rates(s)))
    answers, start = run(world, rates, 6, script)
    within_bound(answers)
    # After a second of warm-up: nearly the whole rate, and requests do not wait on another
    # region (a call to another region's ledger costs its round trip; 150 ms stand out of
    # this machine's jitter). Leases are renewed ahead of need, but on a busy machine a
    # renewal can come late and one request wait for it (one of 300 took 156 ms beside the
    # other tests' workers), so the 99th percentile is held under the round trip, not the
    # slowest request.
    assert admitted_rate(answers, start + 1, start + 6) >= 0.85 * RATE
    if rtt_ms >= 150:
        took = sorted(a.done - a.sent for a in answers if a.sent > start + 1)
        p99 = took[int(0.99 * (len(took) - 1))]
        assert p99 < rtt_ms / 1000, f"p99 {p99 * 1000:.0f} ms, slowest {took[-1] * 1000:.0f} ms"


def test_leases_outliving_the_burst_still_admit_the_rate(world_of):
    """lease_ttl's default (2 s) outlives the burst (a second of the rate): a lease spent
    goes back to its ledger at once, or its tokens would hold the ledger's refill back to
    `capacity / lease_ttl` a second, half the rate."""
    world = world_of(config(ttl_ms=None))
    answers, start = run(world, UNIFORM, 7)
    within_bound(answers)
    assert admitted_rate(answers, start + 2, start + 7) >= 0.85 * RATE


def test_a_cold_key_hit_in_every_region_at_once_keeps_its_budget(world_of):
    world = world_of(config())
    world.set_latency(40)
    answers, _ = run(world, {r: 10 * RATE / 3 for r in "abc"}, 3,
                     headers={"x-api-key": "cold-tenant"})
    within_bound(answers)
    assert sum(a.status == 200 for a in answers) >= RATE


def test_a_burst_under_the_limit_far_from_home_is_admitted(world_of):
    """A lease is sized on the spending seen so far: a key's first lease in c holds one
    token, and the requests that outrun it wait for the next grant (home still has tokens)
    instead of being refused for a lease that was small."""
    world = world_of(config(home="a"))
    world.set_latency(150)
    port = world.regions["c"].ports[0]
    statuses = [request(port, "/api/burst", KEY)[0] for _ in range(RATE // 2)]
    assert statuses == [200] * (RATE // 2)


@pytest.mark.parametrize("share", [None, 0.1])
def test_a_region_cut_off_spends_what_it_holds_then_refuses_or_its_share(world_of, share):
    world = world_of(config(share=share, home="a"))
    cut_at, heal_at = 2.0, 4.0
    script = [(cut_at, lambda w, _d: w.cut("c")), (heal_at, lambda w, _d: w.cut("c", False))]
    answers, start = run(world, UNIFORM, 6, script)
    within_bound(answers)
    f = share or 0
    cut = [a for a in answers if start + cut_at + TTL_MS / 1000 <= a.sent < start + heal_at]
    others = sum(a.status == 200 for a in cut if a.region != "c")
    span = heal_at - cut_at - TTL_MS / 1000
    assert others <= (1 - f) * (RATE + RATE * span) + 1, others
    own = sum(a.status == 200 for a in cut if a.region == "c")
    if share:
        assert own > 0, "a region cut off spends its share"
        assert own <= f * (RATE + RATE * span) + 1, own
    else:
        assert own == 0, "a region cut off, its lease over, refuses"


def test_replies_dropped_one_way_mint_no_tokens(world_of):
    world = world_of(config(home="a"))
    script = [(1.5, lambda w, _d: w.link("b", "a").set(drop_replies=True)),
              (4.0, lambda w, _d: w.link("b", "a").set(drop_replies=False))]
    answers, _ = run(world, UNIFORM, 5.5, script)
    within_bound(answers)


def test_a_dead_region_leaves_the_survivors_the_rate(world_of):
    world = world_of(config(home="a"))
    killed = {}

    def kill(w, demand):
        w.regions["c"].bridge.kill()
        demand.set_rates({"a": 1.5 * RATE, "b": 1.5 * RATE, "c": 0})
        killed["at"] = time.monotonic()

    answers, _ = run(world, UNIFORM, 5, [(2.0, kill)])
    within_bound(answers)
    back = killed["at"] + TTL_MS / 1000 + 0.3
    assert admitted_rate(answers, back, back + 2) >= 0.85 * RATE


def test_negative_control_three_independent_buckets_are_caught(world_of):
    world = world_of(config(global_=False))
    answers, _ = run(world, UNIFORM, 3)
    assert excess(answers, RATE, RATE, 1) > RATE / 2, "three budgets, not one"


def rls_regions(global_):
    """A region's stack: Envoy's own `ratelimit` filter, the bridge as its rate limit
    service, the tenant's descriptor limited as `config()` limits the plugin's rule, global
    (`rate_limit.global`) or not."""
    terms = f", global: {{lease_ttl: {TTL_MS}ms}}" if global_ else ""
    limits = (f"domain: api\ndescriptors:\n  - key: api_key\n"
              f"    rate_limit: {{unit: second, requests_per_unit: {RATE}{terms}}}\n")
    tenant = {"actions": [{"request_headers": {"header_name": "x-api-key",
                                               "descriptor_key": "api_key"}}]}
    return lambda _plugin, args: RlsStack(limits, [tenant], gateways=1, bridge_args=args)


@pytest.mark.parametrize("global_", [True, False], ids=["global", "negative-control-plain"])
def test_a_rate_limit_service_descriptor_made_global_keeps_one_budget(world_of, global_):
    """The rate limit service's door to global rules: three times the rate through
    Envoy's `ratelimit` filter in three regions stays within one budget; the same
    descriptor without `global` (three budgets) is caught by the same checker."""
    world = world_of(None, stack_of=rls_regions(global_))
    answers, start = run(world, UNIFORM, 4)
    if not global_:
        assert excess(answers, RATE, RATE, 1) > RATE / 2, "three budgets, not one"
        return
    within_bound(answers)
    assert admitted_rate(answers, start + 1, start + 4) >= 0.85 * RATE
    granted = 'ratelimit_bridge_global_leases_total{event="granted"}'
    assert all(series(stack, granted) > 0 for stack in world.regions.values())
    # `usage` names the descriptor as Envoy sends it and reads its ledger at its home.
    a = world.regions["a"]
    flags = a.bridge.argv
    regions = [f for i, f in enumerate(flags) if f.startswith("--region")
               or flags[i - 1].startswith("--region")]
    usage = subprocess.run(
        [BRIDGE, "usage", "--redis", flags[flags.index("--redis") + 1], *regions,
         "--rls-config", str(a.rls_file), "--domain", "api", "--entry", "api_key=tenant-1"],
        capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0, usage.stderr
    seen = json.loads(usage.stdout)
    assert seen["key"] == "rl:rls:api:api_key:tenant-1" and seen["global"]["home"] in "abc", seen
    assert seen["global"]["ledger"]["capacity"] == RATE, seen


def test_negative_control_regions_syncing_counts_asynchronously_are_caught(world_of):
    # What Unkey and others do: each region its own bucket, and every second each region's
    # bucket is charged what the others admitted since the last exchange (a settlement
    # line, which takes tokens even below 0).
    world = world_of(config(global_=False))
    demand = Demand(world, UNIFORM, KEY).start()
    stop = threading.Event()

    def gossip():
        counted = {r: 0 for r in world.names}
        for n in range(1000):
            if stop.wait(1.0):
                return
            with demand.lock:
                now = {r: sum(a.status == 200 and a.region == r for a in demand.answers)
                       for r in world.names}
            for r in world.names:
                others = sum(now[o] - counted[o] for o in world.names if o != r)
                if others:
                    line = f"= sync-{n}-{r} rl:tenant:tenant-1,{RATE},1,50,{others},1000\n"
                    status, _, body = request(world.regions[r].bridge_port, "/v1/check",
                                              method="POST", body=line.encode())
                    assert status == 200 and " s," in body, body
            counted = now

    syncing = threading.Thread(target=gossip, daemon=True)
    syncing.start()
    time.sleep(4)  # demand and gossip for 4 s: the excess is measured over what they did
    stop.set()
    syncing.join()
    answers = demand.stop()
    # However the counts meet, between two exchanges every region spends a burst of its own.
    assert excess(answers, RATE, RATE, 1) > RATE / 2


# A burst five times the rate: a replica that hands it out a second time stands out.
FAILOVER_BURST = 5 * RATE


def failover_run(world, forge):
    """The home's Redis fails over to a replica that missed the last grants: the key's
    ledger copied while full, the copying cut, the burst and two seconds of demand taken
    from the primary, then the primary killed and its replica promoted. With `forge`,
    the ledger on the replica is made to look written by it (a ledger without learning)."""
    run(world, {r: 1 for r in world.names}, 0.6)  # the key's ledger written
    world.replicated()
    world.replication.set(cut=True)
    time.sleep(1.2)  # the ledger full again, on both

    def forge_writer():
        own = world.replica_redis("INFO", "server")["run_id"]
        key = "rl:tenant:tenant-1{rl:tenant:tenant-1}#ledger"
        value = world.replica_redis("GET", key)
        world.replica_redis("SET", key, own + value[40:], "PX", 60_000)

    def fail_over(w, _demand):
        w.fail_over(promoted=forge_writer if forge else lambda: None)

    answers, _ = run(world, {r: 3.5 * RATE for r in world.names}, 5, [(2.0, fail_over)])
    return answers


def test_a_home_failing_over_to_a_replica_that_missed_grants_learns_and_mints_nothing(world_of):
    world = world_of(config(home="a", burst=FAILOVER_BURST), replica_of="a")
    answers = failover_run(world, forge=False)
    within_bound(answers, FAILOVER_BURST)


def test_negative_control_a_failover_without_learning_is_caught(world_of):
    world = world_of(config(home="a", burst=FAILOVER_BURST), replica_of="a")
    answers = failover_run(world, forge=True)
    worst = max(excess(answers, FAILOVER_BURST, RATE, w) for w in WINDOWS)
    assert worst >= FAILOVER_BURST / 2, f"the replica's stale burst went unnoticed: {worst}"


def test_a_home_failing_over_to_a_replica_that_never_had_the_ledger_learns(world_of):
    """The replica, older than a lease's life, stops copying before the key's ledger is
    written: promoted while the old primary's leases are still spent, it finds no ledger
    and must not start it full (issue 49, row 6: 269 admitted in 4 s against 180)."""
    world = world_of(config(home="a", burst=FAILOVER_BURST), replica_of="a")
    world.replication.set(cut=True)
    answers, _ = run(world, {r: 3.5 * RATE for r in world.names}, 5,
                     [(2.0, lambda w, _d: w.fail_over())])
    within_bound(answers, FAILOVER_BURST)


def hash_home(key, names):
    """The home a bridge naming `names` chooses for `key` (`digest::bucket_of`)."""
    first = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return sorted(names)[first % len(names)]


# A tenant whose key a bridge naming a, b and c homes elsewhere than one naming a and c.
SPLIT_TENANT = next(f"tenant-{i}" for i in range(100)
                    if hash_home(f"rl:tenant:tenant-{i}", "abc")
                    != hash_home(f"rl:tenant:tenant-{i}", "ac"))


def series(stack, name):
    """A series of a bridge's /metrics, 0 if absent."""
    _, _, body = request(stack.bridge_port, "/metrics")
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.mark.parametrize("disagreeing", ["home", "regions"])
def test_bridges_that_disagree_on_the_regions_or_a_home_refuse_the_rule(world_of, disagreeing):
    """c's gateway homes the rule in b while a's and b's home it in a, or c's bridge does
    not name b (a rolling restart that moves a home, or adds a region, half done): two
    ledgers for one key (issue 49, row 7: 153 admitted in 3 s against 80). The rule is
    refused, loudly, rather than spent from a second budget."""
    if disagreeing == "home":
        world = world_of(config(home="a"), plugins={"c": config(home="b")})
        headers = KEY
    else:
        world = world_of(config(), listing={"c": ["a", "c"]})
        headers = {"x-api-key": SPLIT_TENANT}
    answers, _ = run(world, UNIFORM, 3, headers=headers)
    within_bound(answers)
    stacks = world.regions.values()
    assert sum(series(s, "ratelimit_bridge_global_disagreements_total") for s in stacks) > 0
    assert any("disagree" in s.logs("bridge") for s in stacks)


# Clocks: a drift of 20 % (the flag's, on every bridge), so that what a clock three times
# as far off does shows within one lease; leases of 5 s; a burst of two seconds' rate, for
# leases large enough to stand out.
DRIFT = 0.2
CLOCK_TTL_MS = 5000
CLOCK_BURST = 2 * RATE


def past_learning(world, home, ttl):
    """A ledger on a server younger than a lease's life grants nothing (learning)."""
    while int(world.regions[home].redis("INFO", "server")["uptime_in_seconds"]) <= ttl:
        time.sleep(0.2)


def clock_run(world_of, clocks):
    """c, whose bridge's clock runs at `clocks["c"]` times true time, spends a little of the
    key and stops, holding leases with tokens left; every region is quiet until the ledger
    has taken them back and refilled; then 1.5x the rate in every region. A bridge whose
    clock runs so slow that its leases outlive the ledger's spends their tokens a second
    time, over a full ledger: the checker's excess."""
    world = world_of(config(home="a", ttl_ms=CLOCK_TTL_MS, burst=CLOCK_BURST), clocks=clocks,
                     bridge_args=["--region-drift-ppm", str(int(DRIFT * 1_000_000))])
    ttl = CLOCK_TTL_MS / 1000
    past_learning(world, "a", ttl)
    spent, quiet = 1.5, 1.5 + ttl + 1.5
    script = [(spent, lambda _w, d: d.set_rates({})),
              (quiet, lambda _w, d: d.set_rates({r: 1.5 * RATE for r in world.names}))]
    answers, start = run(world, {"c": RATE / 2}, quiet + 1.5, script)
    assert sum(a.status == 200 and a.sent < start + spent for a in answers) >= RATE / 2
    return answers


def test_bridges_whose_clocks_run_fast_or_slow_within_the_drift_keep_the_bound(world_of):
    """c's clock 18 % slow, b's 20 % fast, against the home's true one: within a drift of
    20 % (docs/regions.md: a bridge's clock runs at least `1 - drift` times as fast as its
    home Redis's), so c stops spending each lease before the ledger takes it back."""
    answers = clock_run(world_of, {"b": 1 + DRIFT, "c": 1 - 0.9 * DRIFT})
    within_bound(answers, CLOCK_BURST)


def test_negative_control_a_clock_three_times_the_drift_slow_is_caught(world_of):
    answers = clock_run(world_of, {"c": 1 - 3 * DRIFT})
    worst = max(excess(answers, CLOCK_BURST, RATE, w) for w in WINDOWS)
    assert worst > 0, f"c spent leases its ledger had taken back, unnoticed: {worst}"

def test_usage_and_check_config_know_a_global_rule(world_of, tmp_path):
    # Leases of 3 s, asked for by a, alone and under the rate, while it spends: the ledger
    # has tokens to grant, and a lease granted in the last second is surely outstanding
    # when `usage` reads the ledger, however slow the machine.
    world = world_of(config(share=0.1, home="b", ttl_ms=3000))
    past_learning(world, "b", 3)
    plugin_file = tmp_path / "plugin.json"
    plugin_file.write_text(json.dumps(world.regions["a"].plugin))
    flags = world.regions["a"].bridge.argv
    regions = [f for i, f in enumerate(flags) if f.startswith("--region")
               or flags[i - 1].startswith("--region")]
    redis = flags[flags.index("--redis") + 1]
    usages = []

    def ask_usage(_world, _demand):
        usages.append(subprocess.run(
            [BRIDGE, "usage", "--redis", redis, *regions, "--config", str(plugin_file),
             "--rule", "tenant", "--value", "tenant-1"],
            capture_output=True, text=True, timeout=30))

    answers, _ = run(world, {"a": RATE / 2}, 1.5, [(1, ask_usage)])
    assert sum(a.status == 200 for a in answers) > 0
    usage = usages[0]
    assert usage.returncode == 0, usage.stderr
    seen = json.loads(usage.stdout)["global"]
    assert seen["home"] == "b" and seen["share"] == 2, seen
    ledger = seen["ledger"]
    assert ledger["capacity"] == 14 and ledger["leases"] >= 1, seen
    assert ledger["tokens"] + ledger["leased"] <= ledger["capacity"], seen
    checked = subprocess.run([BRIDGE, "check-config", str(plugin_file)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
