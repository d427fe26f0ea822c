//! envoyproxy/ratelimit's configuration as it is written, before it is checked: a domain's
//! YAML document (`RawDomain`) and its tree of descriptors, each field as that service
//! names it and nothing else (`deny_unknown_fields`); xDS's messages are converted to the
//! same (`xds::convert`). And the protocol's units, by number. `limits` builds the lookup
//! from these.

use super::metadata::yaml_metadata;
use super::proto::Struct;
use ratelimit_config::global::RawGlobal;
use ratelimit_config::in_flight::RawInFlight;
use serde::Deserialize;

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`, in its numbering, and the
/// length of each: a month is 30 days and a year 365, as envoyproxy/ratelimit counts them.
const UNITS: [(&str, i32, u64); 7] = [
    ("second", 1, 1_000),
    ("minute", 2, 60_000),
    ("hour", 3, 3_600_000),
    ("day", 4, 86_400_000),
    ("month", 5, 30 * 86_400_000),
    ("year", 6, 365 * 86_400_000),
    ("week", 7, 7 * 86_400_000),
];

/// The length of a unit, by its number in the protocol (`None`: not a unit).
pub fn unit_ms(unit: i32) -> Option<u64> {
    UNITS.iter().find(|u| u.1 == unit).map(|u| u.2)
}

/// A unit by its name in the YAML, in any case: its name, number and length.
pub fn unit_named(text: &str) -> Option<(&'static str, i32, u64)> {
    UNITS
        .iter()
        .find(|u| u.0.eq_ignore_ascii_case(text))
        .copied()
}

/// The name of a unit, by its number in the protocol (`None`: not a unit).
pub fn unit_name(unit: i32) -> Option<&'static str> {
    UNITS.iter().find(|u| u.1 == unit).map(|u| u.0)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDomain {
    pub(crate) domain: String,
    #[serde(default)]
    pub(crate) descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub(crate) descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    pub(crate) shadow_mode: bool,
    #[serde(default)]
    pub(crate) share_threshold: bool,
    /// Accepted and ignored, as `value_to_metric`: the bridge's series are per configured
    /// descriptor, never per client value, so their number stays bounded.
    #[serde(default, rename = "detailed_metric")]
    pub(crate) _detailed_metric: bool,
    #[serde(default, rename = "value_to_metric")]
    pub(crate) _value_to_metric: bool,
    /// A map of any YAML, as envoyproxy/ratelimit reads it: what its limit adds to the
    /// dynamic metadata of a call it passes (`--rls-dynamic-metadata`).
    #[serde(default, deserialize_with = "yaml_metadata")]
    pub(crate) metadata: Option<Struct>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub(crate) unit: Option<String>,
    pub(crate) requests_per_unit: Option<u32>,
    #[serde(default)]
    pub(crate) unlimited: bool,
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) replaces: Vec<RawReplaces>,
    /// The bridge's own: one budget across regions, as a plugin rule's `global`
    /// (docs/regions.md).
    pub(crate) global: Option<RawGlobal>,
    /// The bridge's own: in place of a unit and requests, at most `max` requests in flight
    /// at once, as a plugin rule's `in_flight` (docs/in-flight.md).
    pub(crate) in_flight: Option<RawInFlight>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplaces {
    pub(crate) name: String,
}
