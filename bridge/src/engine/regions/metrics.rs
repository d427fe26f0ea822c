//! The series of global rules' leases (`regions`), kept by the regions and shown on
//! `/metrics` before the bridge's others (`metrics`, `probes::render`): what the ledgers
//! granted this bridge, what it returned, what expired unspent here, what the ledgers
//! refused, and how long a call to each region's ledger took (the cross-region round trip
//! a cold key pays), and the checks refused because bridges disagree on where a rule's
//! ledgers are. Labels are the events below and the regions of `--region-redis`: bounded.

use crate::ops::metrics::PREFIX;
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// What happened to a lease, or to an ask for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The ledger granted tokens, and this bridge spends them.
    Granted,
    /// Tokens a lease left unspent went back to the ledger.
    Returned,
    /// A lease ended here (its unspent tokens are counted as `tokens`).
    Expired,
    /// The ledger had nothing to grant (spent, or learning after a failover).
    Refused,
    /// The ledger did not answer in time: a region cut off, or a home down.
    Failed,
    /// Tokens neither spent nor returned: a grant that came too late, a lost return.
    Stranded,
}

const EVENTS: [&str; 6] = [
    "granted", "returned", "expired", "refused", "failed", "stranded",
];

/// Bounds of `global_ledger_seconds`: from a loopback call to a slow ocean crossing.
const LEDGER_SECONDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegionLabel {
    /// A region of `--region-redis`.
    region: String,
}

type Static = [(&'static str, &'static str); 1];

/// The series of the leases of global rules.
pub struct GlobalMetrics {
    /// What `/metrics` encodes of them: every series below.
    registry: Registry,
    /// `global_leases_total{event}`: leases (or asks) by what became of them.
    leases: [Counter; EVENTS.len()],
    /// `global_lease_tokens_total{event}`: their tokens.
    tokens: [Counter; EVENTS.len()],
    /// `global_ledger_seconds{region}`.
    seconds: Family<RegionLabel, Histogram, fn() -> Histogram>,
    /// `global_disagreements_total`: checks refused because bridges disagree on where a
    /// rule's ledgers are (`regions::agree`).
    disagreements: Counter,
}

fn ledger_seconds() -> Histogram {
    Histogram::new(LEDGER_SECONDS)
}

impl Default for GlobalMetrics {
    fn default() -> GlobalMetrics {
        GlobalMetrics::new()
    }
}

impl GlobalMetrics {
    /// Its series, in a registry of their own under the bridge's prefix.
    pub fn new() -> GlobalMetrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let leases = Family::<Static, Counter>::default();
        let tokens = Family::<Static, Counter>::default();
        let m = GlobalMetrics {
            registry: Registry::default(),
            leases: EVENTS.map(|e| leases.get_or_create_owned(&[("event", e)])),
            tokens: EVENTS.map(|e| tokens.get_or_create_owned(&[("event", e)])),
            seconds: Family::new_with_constructor(ledger_seconds),
            disagreements: Counter::default(),
        };
        registry.register(
            "global_leases",
            "Leases of global rules' ledgers (or asks for one), by what became of them",
            leases,
        );
        registry.register(
            "global_lease_tokens",
            "Tokens of those leases, by what became of them",
            tokens,
        );
        registry.register_with_unit(
            "global_ledger",
            "Time a call to a region's ledger took, sent to answered, by region",
            Unit::Seconds,
            m.seconds.clone(),
        );
        registry.register(
            "global_disagreements",
            "Checks of global rules refused because bridges disagree on the regions or a \
             rule's home (two ledgers for one key)",
            m.disagreements.clone(),
        );
        GlobalMetrics { registry, ..m }
    }

    /// The series as OpenMetrics text, without the end marker (`probes::render` adds it).
    pub fn encode(&self, out: &mut String) -> std::fmt::Result {
        text::encode_registry(out, &self.registry)
    }

    /// A check refused: bridges disagree on where its rule's ledgers are.
    pub fn disagreed(&self) {
        self.disagreements.inc();
    }

    /// One lease (or ask) and its `tokens`.
    pub fn lease(&self, event: Event, tokens: u64) {
        let i = event as usize;
        if let (Some(n), Some(t)) = (self.leases.get(i), self.tokens.get(i)) {
            n.inc();
            t.inc_by(tokens);
        }
    }

    /// A call to `region`'s ledger, answered (or given up) after `elapsed`.
    pub fn ledger_call(&self, region: &str, elapsed: Duration) {
        let label = RegionLabel {
            region: region.into(),
        };
        self.seconds
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }
}
