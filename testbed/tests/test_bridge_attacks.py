"""End to end, the security review's attacks on the bridge itself: HTTP/2 peers that hold
connections and never read (testbed/attacks.py), beside a real gateway in real Envoy."""

import time

from testbed.attacks import GRPC_PATH, Unreading, stream_flood_message
from testbed.plugins import plugin, rule
from testbed.stack import request, wait_for

TOKEN = "gateways-Token_e2e"
USER = {"user": {"header": "x-user-id"}}


def with_token(tmp_path):
    config = plugin(rule("per-user", ["user"], 1000), identity=USER)
    config["backend"]["token"] = TOKEN
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return config, ["--token-file", str(token_file)]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def test_a_gateway_started_while_unreading_peers_hold_every_slot_is_served(stack_of, tmp_path):
    config, args = with_token(tmp_path)
    slots = 64
    stack = stack_of(config, bridge_args=[*args, "--max-connections", str(slots)])
    gateway = stack.envoys[0]
    gateway.stop()
    # Every slot, held again as soon as the bridge frees one: half health checks, half
    # checks without the token (401), none of whose answers can ever be sent.
    attackers = [Unreading(stack.bridge_port, slots // 2, path=path).start()
                 for path in ("/healthz", "/v1/check")]
    try:
        wait_for("the attack", lambda: sum(a.open for a in attackers) >= slots, timeout=30)
        time.sleep(1)  # the attack held a while (slots freed and taken again): longer only harder
        # A gateway (re)started during the attack: it was refused every connection and
        # answered 503 (failure mode closed) to every request.
        gateway.start()
        wait_for("envoy", lambda: request(stack.admin_ports[0], "/ready", timeout=1)[0] == 200,
                 timeout=60, proc=gateway.proc, log=gateway.log)
        statuses = [stack.get(0, "/", {"x-user-id": f"u{i}"})[0] for i in range(20)]
        assert statuses == [200] * 20, statuses
        assert sum(a.open for a in attackers) >= slots - 4, "the attack went on"
    finally:
        for attacker in attackers:
            attacker.stop()


def test_token_holders_that_never_read_are_cut_off_and_the_gateway_keeps_its_answers(stack_of, tmp_path):
    config, args = with_token(tmp_path)
    stack = stack_of(config, bridge_args=[*args, "--write-timeout-ms", "2000",
                                          "--max-pending-mib", "32"])
    bridge = stack.bridge.proc.pid
    assert stack.get(0, "/", {"x-user-id": "warm"})[0] == 200
    before = rss_mib(bridge)

    attacker = Unreading(stack.bridge_port, 20, path=GRPC_PATH, token=TOKEN,
                         message=stream_flood_message, hold=True).start()
    peak, statuses = before, []
    try:
        end = time.monotonic() + 12
        while time.monotonic() < end:
            statuses.append(stack.get(0, "/", {"x-user-id": f"u{len(statuses)}"})[0])
            peak = max(peak, rss_mib(bridge))
            time.sleep(0.1)
    finally:
        attacker.stop()
    assert set(statuses) == {200}, statuses
    # Each stream's connection is cut by the write deadline, and opened again.
    assert attacker.closed >= 20, attacker.closed
    assert peak < before + 32 + 48, f"bridge RSS {before} MiB before, {peak} MiB at the peak"
