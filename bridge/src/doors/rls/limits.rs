//! envoyproxy/ratelimit's configuration, read as it is written: a YAML document per domain,
//! `domain` and a tree of `descriptors` (`key`, optional `value`, `*`s in it as wildcards,
//! `rate_limit {unit, requests_per_unit, unlimited, name, replaces}`, `shadow_mode`,
//! `share_threshold`, `detailed_metric`, `value_to_metric`, `metadata`, nested
//! `descriptors`), and the lookup that finds a request descriptor's limit in it, as that
//! service finds it: at each entry an exact `key`/`value` first, then a wildcard, then the
//! `key` alone; the limit applies only where the descriptor's last entry lands.
//!
//! What differs is the bucket, not the configuration: `requests_per_unit` per `unit` is a
//! token bucket of that capacity refilled evenly over the unit, so no window edge lets a
//! client through twice. Anything else (an unknown field, a unit that does not exist, a
//! composite key twice) is refused with one line naming the file and the descriptor.

use super::bounds;
use super::metrics::RuleLabel;
use super::proto::Struct;
use super::raw::{unit_named, RawDescriptor, RawDomain, RawRateLimit};
use super::wildcard::Wildcard;
use ratelimit_config::in_flight::InFlight;
use ratelimit_config::limit::Limit;
use ratelimit_protocol::global::Global;
use std::collections::HashMap;
use std::sync::Arc;

/// What a configured descriptor's limit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// `unlimited: true`: always within.
    Unlimited,
    /// `requests_per_unit: 0`: always over, without asking Redis.
    Blocked,
    /// A token bucket.
    Bucket(Limit),
    /// A set of slots (`in_flight`): taken by a descriptor ending in `ratelimit.slot`,
    /// given back by one ending in `ratelimit.release`.
    Slots(InFlight),
}

/// A configured descriptor's limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its domain and path, `key_value.key`: the labels of its series, made once here rather
    /// than on every call.
    pub label: RuleLabel,
    pub name: String,
    pub quota: Quota,
    /// `requests_per_unit` and `unit` as configured, for the answer's `current_limit`.
    pub requests_per_unit: u32,
    pub unit: i32,
    pub shadow: bool,
    /// Names of limits this one replaces when both apply to a request.
    pub replaces: Vec<String>,
    /// Entries (by position) whose value the bucket is keyed on as configured (the wildcard
    /// pattern), not as sent: a `share_threshold` wildcard shares one bucket.
    pub shared: Vec<(usize, String)>,
    /// The descriptor's `metadata`, for the dynamic metadata of a call it passes.
    pub metadata: Option<Struct>,
    /// One budget across regions (`rate_limit.global`): checked through the bridge's
    /// leases of its ledger, as a plugin's global rule is.
    pub global: Option<Global>,
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Level {
    /// By key, then by value.
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, pattern, node)` of values with a `*`, in the file's order: the first that
    /// matches is taken, as envoyproxy/ratelimit takes it.
    wildcards: Vec<(String, Wildcard, Node)>,
    any: HashMap<String, Node>,
}

#[derive(Debug, Default)]
struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub struct Limits {
    domains: HashMap<String, Level>,
}

impl Limits {
    /// Reads `files` (name, text), one domain each; those of one domain merged with
    /// `merge` (`Limits::build`).
    pub fn parse<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge: bool,
    ) -> Result<Limits, String> {
        let domains = files
            .into_iter()
            .map(|(file, text)| {
                // Held to its bounds first: the parser's time grows with the square of
                // the depth, and it refuses a deep document only once it has read it all.
                bounds::check(text).map_err(|e| format!("{file}: {e}"))?;
                let raw: RawDomain =
                    serde_yaml_ng::from_str(text).map_err(|e| format!("{file}: {e}"))?;
                Ok((file.to_owned(), raw))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Limits::build(domains, merge)
    }

    /// The limits of `domains`, each named by where it came from (a file, a resource). A
    /// domain twice is refused, or with `merge` its descriptors join the tree it has, as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG` patches a domain: the same descriptor
    /// in two of them is still refused.
    pub(crate) fn build(domains: Vec<(String, RawDomain)>, merge: bool) -> Result<Limits, String> {
        let mut limits = Limits::default();
        for (origin, raw) in domains {
            if raw.domain.is_empty() {
                return Err(format!("{origin}: the domain is empty"));
            }
            if !merge && limits.domains.contains_key(&raw.domain) {
                return Err(format!(
                    "{origin}: domain {:?} is configured twice (MERGE_DOMAIN_CONFIG, \
                     --rls-merge-domains, merges them)",
                    raw.domain
                ));
            }
            let level = limits.domains.entry(raw.domain.clone()).or_default();
            build(level, &raw.domain, raw.descriptors, "", &[], 0)
                .map_err(|e| format!("{origin}: domain {:?}: {e}", raw.domain))?;
        }
        Ok(limits)
    }

    /// The limit of a descriptor of `entries` (key, value) in `domain`, if one is configured.
    pub fn find<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<&Arc<Rule>> {
        let mut level = self.domains.get(domain)?;
        let last = entries.len().checked_sub(1)?;
        for (i, (key, value)) in entries.enumerate() {
            let node = level
                .exact
                .get(key)
                .and_then(|values| values.get(value))
                .or_else(|| {
                    level
                        .wildcards
                        .iter()
                        .find(|(k, pattern, _)| k == key && pattern.matches(value))
                        .map(|(_, _, node)| node)
                })
                .or_else(|| level.any.get(key))?;
            if i == last {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }

    /// Whether `domain` is configured (with descriptors or none).
    pub fn configures(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The domains configured.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }
}

/// Descriptors deeper than this are refused: Envoy sends a handful of entries.
const MAX_DEPTH: usize = 16;

fn build(
    level: &mut Level,
    domain: &str,
    raws: Vec<RawDescriptor>,
    parent: &str,
    shared: &[(usize, String)],
    depth: usize,
) -> Result<(), String> {
    if depth >= MAX_DEPTH {
        return Err(format!("descriptors nest deeper than {MAX_DEPTH}"));
    }
    for raw in raws {
        if raw.key.is_empty() {
            return Err(format!("a descriptor under {parent:?} has an empty key"));
        }
        let step = match &raw.value {
            Some(value) => format!("{}_{value}", raw.key),
            None => raw.key.clone(),
        };
        let path = match parent {
            "" => step,
            _ => format!("{parent}.{step}"),
        };
        let mut shared = shared.to_vec();
        let wildcard = raw.value.as_deref().and_then(Wildcard::new);
        if let (Some(wildcard), true) = (&wildcard, raw.share_threshold) {
            shared.push((depth, wildcard.pattern.clone()));
        } else if raw.share_threshold {
            return Err(format!("{path}: share_threshold needs a value with a '*'"));
        }
        let mut node = Node {
            rule: raw
                .rate_limit
                .map(|r| rule(r, domain, &path, raw.shadow_mode, &shared))
                .transpose()?
                .map(|mut rule| {
                    rule.metadata = raw.metadata;
                    Arc::new(rule)
                }),
            children: Level::default(),
        };
        build(
            &mut node.children,
            domain,
            raw.descriptors,
            &path,
            &shared,
            depth + 1,
        )?;
        let taken = match (&raw.value, wildcard) {
            (Some(_), Some(wildcard)) => {
                let taken = level
                    .wildcards
                    .iter()
                    .any(|(k, w, _)| *k == raw.key && *w == wildcard);
                if !taken {
                    level.wildcards.push((raw.key, wildcard, node));
                }
                taken
            }
            (Some(value), None) => level
                .exact
                .entry(raw.key)
                .or_default()
                .insert(value.clone(), node)
                .is_some(),
            (None, _) => level.any.insert(raw.key, node).is_some(),
        };
        if taken {
            return Err(format!("{path}: the same descriptor is configured twice"));
        }
    }
    Ok(())
}

fn rule(
    raw: RawRateLimit,
    domain: &str,
    path: &str,
    shadow: bool,
    shared: &[(usize, String)],
) -> Result<Rule, String> {
    // As envoyproxy/ratelimit refuses them: an empty name replaces nothing, and a limit
    // replacing itself would drop itself wherever it applies.
    for replaced in &raw.replaces {
        if replaced.name.is_empty() {
            return Err(format!("{path}: an empty replaces entry"));
        }
        if raw.name.as_deref() == Some(replaced.name.as_str()) {
            return Err(format!("{path}: replaces its own name {:?}", replaced.name));
        }
    }
    let (quota, unit) = if let Some(in_flight) = raw.in_flight {
        if raw.unlimited || raw.unit.is_some() || raw.requests_per_unit.is_some() {
            return Err(format!(
                "{path}: an in_flight rate_limit takes no unit, requests_per_unit or unlimited"
            ));
        }
        let in_flight = in_flight
            .validate("rate_limit.in_flight")
            .map_err(|e| format!("{path}: {e}"))?;
        (Quota::Slots(in_flight), 0)
    } else if raw.unlimited {
        if raw.unit.is_some() || raw.requests_per_unit.is_some() {
            return Err(format!(
                "{path}: an unlimited rate_limit takes no unit or requests_per_unit"
            ));
        }
        (Quota::Unlimited, 0)
    } else {
        let text = raw
            .unit
            .as_deref()
            .ok_or_else(|| format!("{path}: rate_limit has no unit"))?;
        let (name, unit, ms) = unit_named(text).ok_or_else(|| {
            format!("{path}: unit {text:?} is not second, minute, hour, day, week, month or year")
        })?;
        let quota = match raw.requests_per_unit {
            None => return Err(format!("{path}: rate_limit has no requests_per_unit")),
            Some(0) => Quota::Blocked,
            Some(n) => Quota::Bucket(
                Limit::new(u64::from(n), ms, None, 1)
                    .map_err(|(_, why)| format!("{path}: {n} per {name}: {why}"))?,
            ),
        };
        (quota, unit)
    };
    let global = match raw.global {
        None => None,
        Some(_) if !matches!(quota, Quota::Bucket(_)) => {
            return Err(format!(
                "{path}: rate_limit.global needs a bucket (requests_per_unit above 0, not \
                 unlimited)"
            ))
        }
        Some(raw) => Some(
            raw.validate("rate_limit.global")
                .map_err(|e| format!("{path}: {e}"))?,
        ),
    };
    Ok(Rule {
        label: RuleLabel {
            domain: domain.to_owned(),
            key: path.to_owned(),
        },
        name: raw.name.unwrap_or_default(),
        quota,
        requests_per_unit: match quota {
            Quota::Slots(f) => u32::try_from(f.max).unwrap_or(u32::MAX),
            _ => raw.requests_per_unit.unwrap_or(0),
        },
        unit,
        shadow,
        replaces: raw.replaces.into_iter().map(|r| r.name).collect(),
        shared: shared.to_vec(),
        metadata: None,
        global,
    })
}

#[cfg(test)]
#[path = "limits_tests.rs"]
mod tests;
