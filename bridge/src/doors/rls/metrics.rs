//! The series of Envoy's rate limit service (`rls`), kept by the service and shown on
//! `/metrics` after the bridge's others (`metrics`, `probes::render`), named as
//! envoyproxy/ratelimit names its per-limit stats so that dashboards carry over: hits in
//! all, over the limit, near it (past 80 % of it), within it, and over it in shadow mode.
//! Labels are the domain and the configured descriptor's path (`key_value.key`), never a
//! client's value: a wildcard or an override adds no series.

use crate::ops::metrics::PREFIX;
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What became of a descriptor's hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hits {
    /// Within the limit; of them, this many past 80% of it used (envoyproxy/ratelimit's
    /// near-limit ratio: the hits that took the use past `floor(0.8 x limit)`).
    Within { near: u64 },
    /// Over the limit: the request was refused (or its cost taken into debt).
    Over,
    /// Over the limit of a descriptor in shadow mode: let through.
    Shadow,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub domain: String,
    /// The configured descriptor's path, or `override` for a caller's limit that matches
    /// none.
    pub key: String,
}

/// The series of the rate limit service.
pub struct RlsMetrics {
    /// What `/metrics` encodes of them: every family below, under `rls_`.
    registry: Registry,
    total_hits: Family<RuleLabel, Counter>,
    over_limit: Family<RuleLabel, Counter>,
    near_limit: Family<RuleLabel, Counter>,
    within_limit: Family<RuleLabel, Counter>,
    shadow_mode: Family<RuleLabel, Counter>,
}

impl Default for RlsMetrics {
    fn default() -> RlsMetrics {
        RlsMetrics::new()
    }
}

impl RlsMetrics {
    /// Its series, in a registry of their own under the bridge's prefix.
    pub fn new() -> RlsMetrics {
        let mut m = RlsMetrics {
            registry: Registry::with_prefix(PREFIX),
            total_hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
        };
        let rls = m.registry.sub_registry_with_prefix("rls");
        for (name, help, family) in [
            ("total_hits", "Hits on a configured limit", &m.total_hits),
            ("over_limit", "Hits over the limit", &m.over_limit),
            (
                "near_limit",
                "Hits within the limit, past 80 % of it",
                &m.near_limit,
            ),
            ("within_limit", "Hits within the limit", &m.within_limit),
            (
                "shadow_mode",
                "Hits over a limit in shadow mode, let through",
                &m.shadow_mode,
            ),
        ] {
            rls.register(name, help, family.clone());
        }
        m
    }

    /// The series as OpenMetrics text, without the end marker (`probes::render` adds it).
    pub fn encode(&self, out: &mut String) -> std::fmt::Result {
        text::encode_registry(out, &self.registry)
    }

    /// `hits` on `label`'s limit, and what became of them. Near hits are within hits too,
    /// as envoyproxy/ratelimit counts them.
    pub fn hits(&self, label: &RuleLabel, hits: u64, became: Hits) {
        self.total_hits.get_or_create(label).inc_by(hits);
        let family = match became {
            Hits::Over => &self.over_limit,
            Hits::Shadow => &self.shadow_mode,
            Hits::Within { .. } => &self.within_limit,
        };
        family.get_or_create(label).inc_by(hits);
        if let Hits::Within { near: near @ 1.. } = became {
            self.near_limit.get_or_create(label).inc_by(near.min(hits));
        }
    }
}
