"""deploy/prometheus/ and deploy/grafana/ against a live stack: a real Prometheus (Debian's
2.42, installed by `make setup`) scrapes two Envoy gateways' admin `/stats/prometheus` and
the bridge's `/metrics` every second, evaluates deploy/prometheus/ratelimit.rules.yaml every
second, and is asked through its HTTP API what fires.

The rules are loaded as the file has them with one change, made in a temporary copy: every
alert's `for:` becomes 1s, so that an alert that fires after a minute or more in production
fires here within seconds. The expressions, windows and thresholds are the file's.

The gateways differ on purpose: gateway 0 fails open with its circuit breaker off (every
request is a check, so the bridge sees Redis fail), gateway 1 fails closed with the default
breaker (which opens, so its requests are short-circuited). Valkey is killed (SIGKILL) and
started again; the backend alerts must fire, then clear.

The dashboard and the rules may only name metrics that exist: every metric name in a
panel's query or a rule's expression must be in the live scrape (Prometheus's own list of
names) or be one of the file's recording rules."""

import json
import os
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from testbed.plugins import plugin, rule
from testbed.stack import (ROOT, VENV_BIN, Background, Process, Stack, envoy_config, free_port,
                           wait_for)

PROMETHEUS = os.environ.get("RATELIMIT_PROMETHEUS", str(VENV_BIN / "prometheus"))
RULES = ROOT / "deploy" / "prometheus" / "ratelimit.rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "ratelimit.json"
GATEWAY_JOB, BRIDGE_JOB = "ratelimit-gateway", "ratelimit-bridge"


# --- Metric names out of PromQL ---------------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool", "inf", "nan"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr):
    """The metric names a PromQL expression selects: every identifier that is not a
    function (followed by `(`), a keyword, a number's exponent or a duration's unit, once
    strings, label matchers `{...}`, ranges `[...]` and `by (...)`, `without (...)`,
    `on (...)`, `ignoring (...)`, `group_left (...)`, `group_right (...)` are cut out."""
    text = STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = CLAUSE.sub(" ", text)
    names = set()
    for m in IDENT.finditer(text):
        before = text[m.start() - 1] if m.start() else " "
        if before.isalnum() or before in "._$":  # 1e3, 5m, $variable
            continue
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group() in KEYWORDS:
            continue
        names.add(m.group())
    return names


def test_metric_names_skips_functions_keywords_matchers_and_clauses():
    expr = ('histogram_quantile(0.99, sum by (node, le) (rate(a_bucket{node=~"$n", x="rate(b)"}'
            '[$__rate_interval]))) / on (job) group_left sum without (kind) '
            '(c:rec:rate5m offset 5m) > bool 1e3 and d unless absent(up{job="x"}) or sum(rate(e[5m])) by (f)')
    assert metric_names(expr) == {"a_bucket", "c:rec:rate5m", "d", "up", "e"}


def dashboard_queries():
    """{where: PromQL} for every panel target and every query variable of the dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for top in dash["panels"] for p in [top, *top.get("panels", [])]]
    queries = {f"panel {p['title']!r} {t['refId']}": t["expr"]
               for p in panels for t in p.get("targets", [])}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", q)
            assert m, f"variable {var['name']}: {q}"
            queries[f"variable {var['name']}"] = m.group(1)
    return queries


def rule_groups():
    return yaml.safe_load(RULES.read_text())["groups"]


def recorded():
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def test_the_dashboard_has_the_panels_the_docs_promise():
    text = "\n".join(dashboard_queries().values())
    for name in ["ratelimit_allowed_rule", "ratelimit_denied_rule", "ratelimit_blocked_rule",
                 "ratelimit_backend_failures", "ratelimit_short_circuits",
                 "ratelimit_bridge_redis_call_seconds_bucket", "ratelimit_bridge_exchanges_total",
                 "ratelimit_bridge_connections", "ratelimit_bridge_script_call_failures_total",
                 "ratelimit_bridge_failures_total"]:
        assert name in text, name
    assert "0.5," in text and "0.99," in text  # p50 and p99


# --- The live stack ---------------------------------------------------------------------

def short_for_rules(path):
    """The rules file with every `for:` at 1s, nothing else changed."""
    groups = rule_groups()
    for group in groups:
        for r in group["rules"]:
            if "for" in r:
                r["for"] = "1s"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))


class Traffic(Background):
    """Requests through one gateway, a new client each (so each one is a check: no deny
    cache, no lease), about 20 a second."""

    def __init__(self, stack, gateway):
        super().__init__()
        self.stack, self.gateway, self.sent = stack, gateway, 0

    def run(self):
        while not self.stopping.is_set():
            try:
                self.stack.get(self.gateway, "/", {"x-user-id": f"client-{self.sent}"}, timeout=5)
            except OSError:
                pass  # counted by the filter or not: the alerts are what is checked
            self.sent += 1
            time.sleep(0.05)


class Live:
    def __init__(self, stack, port):
        self.stack, self.port = stack, port

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, state="firing"):
        """{(alertname, instance or node or ''): labels} of the alerts in `state`."""
        def where(labels):
            return labels.get("instance", labels.get("node", ""))
        return {(a["labels"]["alertname"], where(a["labels"])): a["labels"]
                for a in self.api("/api/v1/alerts")["alerts"] if a["state"] == state}

    def names(self):
        return set(self.api("/api/v1/label/__name__/values"))

    def query(self, expr):
        return self.api("/api/v1/query", query=expr)["result"]

    def outage(self, until, timeout=60):
        """Valkey killed until `until()` holds, then started again."""
        self.stack.valkey.kill()
        try:
            wait_for("the outage to show", until, timeout=timeout)
        finally:
            self.stack.start_valkey()


@pytest.fixture(scope="module")
def live():
    rules = [rule("per-user", ["user"], 1000, per="1m")]
    open_no_breaker = plugin(*rules, failure_mode="open", timeout_ms=300,
                             circuit_breaker={"failures": 0})
    closed_breaker = plugin(*rules, failure_mode="closed", timeout_ms=300)
    stack = Stack(open_no_breaker, gateways=2)
    # Gateway 1 fails closed, with the default breaker: its own configuration file.
    Path(stack.workdir, "envoy-1.json").write_text(json.dumps(envoy_config(
        closed_breaker, stack.ports[1], stack.admin_ports[1], stack.bridge_port)))
    prometheus, traffic = None, []
    try:
        stack.start()
        work = Path(stack.workdir)
        short_for_rules(work / "ratelimit.rules.yaml")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": ["ratelimit.rules.yaml"],
            "scrape_configs": [
                {"job_name": GATEWAY_JOB, "metrics_path": "/stats/prometheus",
                 "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in stack.admin_ports]}]},
                {"job_name": BRIDGE_JOB,
                 "static_configs": [{"targets": [f"127.0.0.1:{stack.bridge_port}"]}]},
            ]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus = Process("prometheus", [
            PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}"], work).start()
        live = Live(stack, port)
        wait_for("prometheus", lambda: live.api("/api/v1/status/buildinfo"), timeout=30,
                 proc=prometheus.proc, log=prometheus.log)
        wait_for("every target up", lambda: sorted(
            float(s["value"][1]) for s in live.query("up")) == [1.0, 1.0, 1.0], timeout=30)
        # The rules loaded, none failing to evaluate.
        groups = live.api("/api/v1/rules")["groups"]
        assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for g in rule_groups())
        wait_for("every rule evaluated", lambda: all(
            r["health"] == "ok" for g in live.api("/api/v1/rules")["groups"] for r in g["rules"]),
            timeout=15)
        traffic = [Traffic(stack, gateway).start() for gateway in (0, 1)]
        yield live
    finally:
        for load in traffic:
            load.stop()
        if prometheus:
            prometheus.stop()
        stack.close()


def backend_alerts_firing(live):
    firing = live.alerts()
    gateways = [f"127.0.0.1:{p}" for p in live.stack.admin_ports]
    bridge = f"127.0.0.1:{live.stack.bridge_port}"
    return ({("RateLimitFailureModeEngaged", g) for g in gateways}
            | {("RateLimitCircuitBreakerOpen", gateways[1]), ("RateLimitBridgeRedisDown", bridge)}
            ) <= firing.keys()


def test_killing_valkey_fires_the_backend_alerts_and_restarting_it_clears_them(live):
    started = time.monotonic()
    gateways = [f"127.0.0.1:{p}" for p in live.stack.admin_ports]
    bridge = f"127.0.0.1:{live.stack.bridge_port}"
    # Healthy traffic: the decisions are counted, nothing fires (the target-missing alerts
    # may fire for a moment before the first scrape; they must have cleared).
    wait_for("decisions counted", lambda: len(
        live.query("instance:ratelimit_decisions:rate1m > 1")) == 2, timeout=20)
    wait_for("no alert firing", lambda: not live.alerts(), timeout=20)

    killed = time.monotonic()
    live.outage(lambda: backend_alerts_firing(live))
    firing = live.alerts()
    print(f"healthy for {killed - started:.1f}s; fired {time.monotonic() - killed:.1f}s after "
          f"Valkey was killed: {sorted(firing)}")
    assert firing[("RateLimitFailureModeEngaged", gateways[0])]["severity"] == "critical"
    assert firing[("RateLimitBridgeRedisDown", bridge)]["severity"] == "critical"
    # Gateway 0's breaker is off: it never short-circuits.
    assert ("RateLimitCircuitBreakerOpen", gateways[0]) not in firing
    # The bridge says why: script calls failing on the connection to Redis.
    kinds = {s["metric"]["kind"] for s in live.query("ratelimit_bridge_script_call_failures_total")}
    assert kinds & {"io", "no_connection", "timeout"}, kinds

    # Valkey is back: the share of requests decided by failure_mode falls under half as
    # healthy traffic fills the 1-minute window, and the alerts clear.
    back = time.monotonic()

    def cleared():
        still = live.alerts().keys() | live.alerts("pending").keys()
        return not {a for a in still if a[0] in (
            "RateLimitFailureModeEngaged", "RateLimitBridgeRedisDown")}
    wait_for("the backend alerts to clear", cleared, timeout=60)
    print(f"cleared {time.monotonic() - back:.1f}s after Valkey restarted; "
          f"{time.monotonic() - started:.1f}s in all")
    # The breaker's alert reads a 1-minute rate of short circuits: it clears a minute after
    # the last one, which this test does not wait for.


def test_the_dashboard_and_the_rules_name_only_metrics_that_exist(live):
    # Script call failures are counted from the first one: a Redis outage makes them.
    if "ratelimit_bridge_script_call_failures_total" not in live.names():
        live.outage(lambda: "ratelimit_bridge_script_call_failures_total" in live.names())
    wait_for("the histograms scraped",
             lambda: "ratelimit_bridge_redis_call_seconds_bucket" in live.names(), timeout=10)
    known = live.names() | recorded()
    missing = {}
    for where, expr in dashboard_queries().items():
        if metric_names(expr) - known:
            missing[f"grafana {where}"] = sorted(metric_names(expr) - known)
    for group in rule_groups():
        for r in group["rules"]:
            where = f"rules {r.get('record') or r.get('alert')}"
            if metric_names(r["expr"]) - known:
                missing[where] = sorted(metric_names(r["expr"]) - known)
    assert not missing, "names no scrape has:\n" + "\n".join(
        f"  {where}: {names}" for where, names in sorted(missing.items()))
    # Each panel's query is PromQL that Prometheus accepts, with Grafana's variables set.
    for where, expr in dashboard_queries().items():
        query = expr.replace("$__rate_interval", "1m")
        query = re.sub(r"\$\w+", ".*", query)
        live.query(query)  # raises unless Prometheus accepts it
