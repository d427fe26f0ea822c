//! The bridge's Prometheus metrics, served as text on `GET /metrics`. The bridge exists to
//! turn many small exchanges from the gateways into few script calls per Redis node; these
//! show an operator whether it does: checks and exchanges in, script calls out per node
//! and how many checks each carried, how long Redis took, what failed and why, and what
//! the gateways hold open (connections, gRPC streams) or have waiting (queue depth).
//!
//! Every label value comes from the bridge's own code or configuration (an outcome, a
//! transport, a script mode, a failure kind, a Redis node's name), never from a client's
//! input, so the number of series stays bounded whatever the clients send.
//!
//! The recording functions run on the serving path and are cheap: an atomic add or two;
//! a histogram takes a short lock. A node's series are made on its first call and found
//! again without allocating.

use super::labels::{Failure, Outcome, Transport};
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

/// The prefix of every series' name, the regions' and the rate limit service's too.
pub const PREFIX: &str = "ratelimit_bridge";

/// What `GET /metrics` answers with: the OpenMetrics text the crate encodes (Prometheus
/// reads it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bounds of `redis_call_seconds` and `exchange_seconds`: from 100 µs (a loopback call) to
/// 1 s (the default `--redis-timeout-ms`).
const CALL_SECONDS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Script modes, in the order of `Node::calls`.
const MODES: [&str; 5] = ["check", "refund", "peek", "settle", "read"];

/// The labels of a node's series (the field names are the label names).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    /// The Redis node: "single", "cluster", or a node's name from the configuration.
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeMode {
    /// As in `NodeLabel`.
    node: String,
    /// The script's mode, one of `MODES`.
    mode: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeKind {
    /// As in `NodeLabel`.
    node: String,
    /// Why the call failed (`redis_failure`).
    kind: String,
}

/// The labels of a plan's checks: an operator's plan name (never a client's input, and as
/// few as the plans an operator sells).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanOutcome {
    plan: String,
    /// `allowed` or `denied`: what the plan's bucket answered.
    outcome: &'static str,
}

/// A label set of one label whose value is a constant: found without allocating.
type Static = [(&'static str, &'static str); 1];
type Histograms = Family<NodeLabel, Histogram, fn() -> Histogram>;

/// One Redis node's series, handles into the families.
struct Node {
    /// `script_calls_total`, one per mode of `MODES`.
    calls: [Counter; MODES.len()],
    /// `redis_call_seconds`.
    seconds: Histogram,
    /// `queue_depth`.
    queue: Gauge,
}

/// The registry and the series the store and the doors record (the regions and the rate
/// limit service keep their own); one per `Store`, shared by its clones.
pub struct Metrics {
    /// What `/metrics` encodes; holds every family below.
    registry: Registry,
    /// `checks_total`, by `Outcome` (its index): made up front so each reads 0 from the
    /// start, as counters should.
    checks: [Counter; 4],
    /// `exchanges_total`, by `Transport` (its index).
    exchanges: [Counter; 2],
    /// `failures_total`, by `Failure` (its index, as in `Failure::ALL`).
    failures: [Counter; Failure::ALL.len()],
    /// `script_calls_total{node,mode}`: what the coalescing turned the checks into.
    script_calls: Family<NodeMode, Counter>,
    /// `script_call_failures_total{node,kind}`: made on a kind's first failure.
    script_failures: Family<NodeKind, Counter>,
    /// `redis_call_seconds{node}`: whether Redis, not the bridge, is what is slow.
    call_seconds: Histograms,
    /// `queue_depth{node}`: checks waiting for a node, set by the store's queue.
    queue_depth: Family<NodeLabel, Gauge>,
    /// Checks per script call: how much the coalescing saves Redis.
    batch_checks: Histogram,
    /// Time an exchange spent in the bridge, read to answered, Redis included: the latency
    /// the bridge adds to a gateway's check, queueing for a call included.
    exchange_seconds: Histogram,
    /// Rules (keys) per script call: what one call costs Redis.
    batch_rules: Histogram,
    /// Client connections open (each holds a `--max-connections` slot).
    connections: Gauge,
    /// gRPC streams open: about one per gateway worker.
    grpc_streams: Gauge,
    /// Each node's series by name, found without building a label set (which allocates).
    nodes: RwLock<HashMap<String, Node>>,
    /// `plan_checks_total{plan,outcome}`: rules checked under a client's plan, per plan.
    plan_checks: Family<PlanOutcome, Counter>,
    /// Each plan's two series (allowed, denied), found without building a label set.
    plans_seen: RwLock<HashMap<String, [Counter; 2]>>,
    /// `plans`: the plans this bridge applies.
    plans: Gauge,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

fn call_seconds() -> Histogram {
    Histogram::new(CALL_SECONDS)
}

impl Metrics {
    pub fn new() -> Metrics {
        let checks = Family::<Static, Counter>::default();
        let exchanges = Family::<Static, Counter>::default();
        let failures = Family::<Static, Counter>::default();
        let mut m = Metrics {
            registry: Registry::with_prefix(PREFIX),
            checks: ["allowed", "denied", "failed", "refused"]
                .map(|o| checks.get_or_create_owned(&[("outcome", o)])),
            exchanges: ["http", "grpc"].map(|t| exchanges.get_or_create_owned(&[("transport", t)])),
            failures: Failure::ALL.map(|f| failures.get_or_create_owned(&[("kind", f.kind())])),
            script_calls: Family::default(),
            script_failures: Family::default(),
            call_seconds: Family::new_with_constructor(call_seconds),
            queue_depth: Family::default(),
            batch_checks: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            exchange_seconds: call_seconds(),
            batch_rules: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            connections: Gauge::default(),
            grpc_streams: Gauge::default(),
            nodes: RwLock::default(),
            plan_checks: Family::default(),
            plans_seen: RwLock::default(),
            plans: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register("checks", "Checks answered, by outcome", checks);
        r.register(
            "exchanges",
            "Exchanges (batches) received, by transport",
            exchanges,
        );
        r.register(
            "script_calls",
            "Script calls sent to Redis, by node and mode (check, refund, peek, settle, read)",
            m.script_calls.clone(),
        );
        r.register(
            "script_call_failures",
            "Script calls that failed, by node and kind",
            m.script_failures.clone(),
        );
        r.register(
            "batch_checks",
            "Checks carried per script call",
            m.batch_checks.clone(),
        );
        r.register_with_unit(
            "exchange",
            "Time an exchange spent in the bridge, read to answered, Redis included",
            Unit::Seconds,
            m.exchange_seconds.clone(),
        );
        r.register(
            "batch_rules",
            "Rules (keys) carried per script call",
            m.batch_rules.clone(),
        );
        r.register_with_unit(
            "redis_call",
            "Time a script call took, sent to answered, by node",
            Unit::Seconds,
            m.call_seconds.clone(),
        );
        r.register(
            "connections",
            "Client connections open",
            m.connections.clone(),
        );
        r.register("grpc_streams", "gRPC streams open", m.grpc_streams.clone());
        r.register(
            "queue_depth",
            "Checks waiting to be sent to a node",
            m.queue_depth.clone(),
        );
        r.register(
            "plan_checks",
            "Rules checked under a client's plan, by plan and outcome",
            m.plan_checks.clone(),
        );
        r.register(
            "plans",
            "Clients' plans this bridge applies",
            m.plans.clone(),
        );
        r.register(
            "failures",
            "Exchanges, streams and connections refused or cut short, by kind",
            failures,
        );
        m
    }

    /// These series alone as OpenMetrics text (`CONTENT_TYPE`); `/metrics` shows the
    /// regions' and the rate limit service's with them (`probes::render`).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// These series as OpenMetrics text without the end marker, for `probes::render`.
    pub fn encode(&self, out: &mut String) -> std::fmt::Result {
        text::encode_registry(out, &self.registry)
    }

    /// One check of an exchange answered.
    pub fn check(&self, outcome: Outcome) {
        if let Some(counter) = self.checks.get(outcome as usize) {
            counter.inc();
        }
    }

    /// A rule checked under the plan `plan`, which its bucket allowed or not.
    pub fn plan_check(&self, plan: &str, allowed: bool) {
        let which = usize::from(!allowed);
        {
            let seen = self
                .plans_seen
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = seen.get(plan).and_then(|s| s.get(which)) {
                series.inc();
                return;
            }
        }
        let series = ["allowed", "denied"].map(|outcome| {
            let labels = PlanOutcome {
                plan: plan.to_string(),
                outcome,
            };
            self.plan_checks.get_or_create_owned(&labels)
        });
        if let Some(counter) = series.get(which) {
            counter.inc();
        }
        let mut seen = self
            .plans_seen
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        seen.entry(plan.to_string()).or_insert(series);
    }

    /// The plans applied now.
    pub fn plans_in_force(&self, count: usize) {
        self.plans.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// An exchange answered `elapsed` after it was read.
    pub fn exchange_answered(&self, elapsed: Duration) {
        self.exchange_seconds.observe(elapsed.as_secs_f64());
    }

    /// One exchange received (its checks are counted by `check`).
    pub fn exchange(&self, transport: Transport) {
        if let Some(counter) = self.exchanges.get(transport as usize) {
            counter.inc();
        }
    }

    /// One exchange, stream or connection refused or cut short.
    pub fn failure(&self, failure: Failure) {
        if let Some(counter) = self.failures.get(failure as usize) {
            counter.inc();
        }
    }

    /// One script call to `node` in `mode` (one of `MODES`) carrying `checks` checks and
    /// `rules` rules, answered (or failed, with the failure's kind, see `redis_failure`)
    /// after `elapsed`.
    pub fn script_call(
        &self,
        node: &str,
        mode: &str,
        checks: usize,
        rules: usize,
        elapsed: Duration,
        result: Result<(), &str>,
    ) {
        self.batch_checks.observe(checks as f64);
        self.batch_rules.observe(rules as f64);
        self.with_node(node, |n| {
            match MODES.iter().position(|m| *m == mode) {
                Some(i) => n.calls.get(i).map_or(0, Counter::inc),
                None => self
                    .script_calls
                    .get_or_create(&node_mode(node, mode))
                    .inc(),
            };
            n.seconds.observe(elapsed.as_secs_f64());
        });
        if let Err(kind) = result {
            let labels = NodeKind {
                node: node.into(),
                kind: kind.into(),
            };
            self.script_failures.get_or_create(&labels).inc();
        }
    }

    /// Checks now waiting to be sent to `node`.
    pub fn queue_depth(&self, node: &str, depth: i64) {
        self.with_node(node, |n| {
            n.queue.set(depth);
        });
    }

    /// Counts a client connection open until the guard is dropped.
    pub fn connection_opened(&self) -> Open {
        self.connections.inc();
        Open(self.connections.clone())
    }

    /// Counts a gRPC stream open until the guard is dropped.
    pub fn stream_opened(&self) -> Open {
        self.grpc_streams.inc();
        Open(self.grpc_streams.clone())
    }

    /// Runs `record` on `node`'s series, made on first use.
    fn with_node(&self, node: &str, record: impl FnOnce(&Node)) {
        {
            let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = nodes.get(node) {
                return record(series);
            }
        }
        let label = NodeLabel { node: node.into() };
        let made = Node {
            calls: MODES.map(|mode| {
                self.script_calls
                    .get_or_create_owned(&node_mode(node, mode))
            }),
            seconds: self.call_seconds.get_or_create_owned(&label),
            queue: self.queue_depth.get_or_create_owned(&label),
        };
        let mut nodes = self.nodes.write().unwrap_or_else(PoisonError::into_inner);
        record(nodes.entry(label.node).or_insert(made));
    }
}

fn node_mode(node: &str, mode: &str) -> NodeMode {
    NodeMode {
        node: node.into(),
        mode: mode.into(),
    }
}

/// An open connection or stream: its gauge counts it until this is dropped.
pub struct Open(Gauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
