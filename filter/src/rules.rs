//! Which rules apply to a request, and the bucket each of them checks.

use crate::block::Block;
use crate::config::{Config, Missing, Rule, MAX_NAME_LEN};
use crate::digest;
use crate::host::RequestView;
use crate::identity::{self, BadIdentity};
use crate::limit::Limit;
use crate::matcher::Methods;
use crate::path;
use crate::scope;
use ratelimit_protocol::key::{DIGEST_MARK, SEPARATOR};
use ratelimit_protocol::MAX_KEY_LEN;
use std::borrow::Cow;

/// Length of a key whose identity values were replaced by their digest: `prefix:rule:#`
/// and 64 hex digits. It must fit the bridge's bound, whatever the names.
const DIGESTED_KEY_LEN: usize = MAX_NAME_LEN + 1 + MAX_NAME_LEN + 2 + 64;
const _: () = assert!(DIGESTED_KEY_LEN <= MAX_KEY_LEN);

/// One bucket to check for the current request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRule {
    /// Index of the rule in `Config::rules`.
    pub rule: usize,
    /// The bucket's Redis key: `prefix:rule[:identity values]`, or `prefix:rule:#digest`
    /// when the values would make it longer than the bridge accepts.
    pub key: String,
    /// The limit in force for this client (its tier's, if it has one).
    pub limit: Limit,
    pub cost: u64,
    /// Tokens this check asks for beyond the cost, as a lease (0: none; see `lease`).
    pub lease: u64,
    /// When the rule blocks repeat offenders (never in shadow mode).
    pub block: Option<Block>,
    /// The rule is in shadow mode: it never denies.
    pub shadow: bool,
}

/// Why a request is refused before any check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplanned {
    /// It carries an identity whose value cannot be told.
    Bad(BadIdentity),
    /// It lacks `identity` (an index into `Config::identities`), which the key of `rule`
    /// needs, and the rule refuses such requests (`"missing": "deny"`).
    Missing { rule: usize, identity: usize },
}

impl From<BadIdentity> for Unplanned {
    fn from(bad: BadIdentity) -> Unplanned {
        Unplanned::Bad(bad)
    }
}

/// Every rule that applies to the request and whose identities it carries, in config order;
/// or why the request is refused: an identity it carries that cannot be told, or one it
/// lacks that a rule will not do without. A rule in shadow mode never refuses: the index of
/// each that would have is handed to `shadow_missing`.
pub fn plan(
    config: &Config,
    req: &impl RequestView,
    mut shadow_missing: impl FnMut(usize),
) -> Result<Vec<PlannedRule>, Unplanned> {
    // Reading :method (and the method overrides) and :path costs scans of the headers and a
    // normalization (with an allocation): only when some rule matches on them.
    let (methods, path) = match config.matches_requests {
        true => {
            let read = |name| req.header(name).unwrap_or_default();
            let mut methods = Methods {
                own: read(":method"),
                overrides: Vec::new(),
            };
            for name in &config.method_override {
                methods.overrides.extend(req.header_list(name));
            }
            (methods, path::normalize(read(":path")))
        }
        false => (Methods::default(), Vec::new()),
    };
    // Identities are resolved at most once per request, and only when a rule needs them.
    let mut values: Vec<Option<Option<Cow<str>>>> = vec![None; config.identities.len()];
    let scope = match config.scopes.is_empty() {
        true => None,
        false => scope::of_request(&config.scopes, req),
    };
    let mut planned = Vec::new();
    for (index, rule) in config.rules.iter().enumerate() {
        if rule.scope != scope || !rule.matcher.matches(&methods, &path) {
            continue;
        }
        resolve(config, req, &mut values, &rule.key)?;
        let value_of = |id: usize| values.get(id)?.as_ref()?.as_deref();
        let mut absent =
            (rule.key.iter().zip(&rule.missing)).filter(|(&id, _)| value_of(id).is_none());
        if let Some((&identity, _)) = absent.clone().find(|(_, &m)| m == Missing::Deny) {
            match rule.shadow {
                true => shadow_missing(index),
                false => {
                    return Err(Unplanned::Missing {
                        rule: index,
                        identity,
                    })
                }
            }
        }
        if absent.next().is_some() {
            continue;
        }
        resolve(config, req, &mut values, rule.tier_identity.as_slice())?;
        let value_of = |id: usize| values.get(id)?.as_ref()?.as_deref();
        let key_values = rule.key.iter().filter_map(|&id| value_of(id));
        planned.push(PlannedRule {
            rule: index,
            key: bucket_key(&config.key_prefix, &rule.name, key_values),
            limit: rule.limit_for(rule.tier_identity.and_then(value_of)),
            cost: rule.cost,
            lease: 0,
            block: rule.block.filter(|_| !rule.shadow).map(|b| b.wire),
            shadow: rule.shadow,
        });
    }
    Ok(planned)
}

/// Resolves the identities `ids` not resolved yet for this request into `values` (by
/// identity index: `Some(None)` once resolved and absent).
fn resolve<'r>(
    config: &Config,
    req: &'r impl RequestView,
    values: &mut [Option<Option<Cow<'r, str>>>],
    ids: &[usize],
) -> Result<(), BadIdentity> {
    for &id in ids {
        if let (Some(slot @ None), Some(identity)) = (values.get_mut(id), config.identities.get(id))
        {
            *slot = Some(identity::resolve(&identity.source, req)?);
        }
    }
    Ok(())
}

/// The Redis key of the bucket of rule `rule` (under `prefix`) for a client whose identity
/// values, escaped as `identity` makes them, are `values` (one per identity of the rule's
/// key, in order): `prefix:rule[:value...]`. The one place keys are made: the filter's
/// planning, and the bridge's `usage` and overrides, which must name the same buckets. Its
/// keys are those of the grammar the bridge holds every check to (`ratelimit_protocol::key`).
///
/// Bounded by construction: past `MAX_KEY_LEN`, the values are replaced by `#` and the
/// SHA-256 of them all. Values are escaped and never hold `:` or `#`, so the joined values
/// are unambiguous and a digested key never equals a verbatim one (a rule's verbatim keys
/// have one component per identity; a rule of one identity never needs the digest).
pub fn bucket_key(
    prefix: &str,
    rule: &str,
    values: impl IntoIterator<Item = impl AsRef<str>>,
) -> String {
    let head = prefix.len() + 1 + rule.len();
    let mut key = String::with_capacity(head + 64);
    key.push_str(prefix);
    key.push(SEPARATOR);
    key.push_str(rule);
    for value in values {
        key.push(SEPARATOR);
        key.push_str(value.as_ref());
    }
    if key.len() <= MAX_KEY_LEN {
        return key;
    }
    let hex = digest::sha256_hex(key.as_bytes().get(head + 1..).unwrap_or_default());
    key.truncate(head);
    key.push(SEPARATOR);
    key.push(DIGEST_MARK);
    key.push_str(&hex);
    key
}

impl Rule {
    /// The limit for a client of `tier` (none, or one the rule does not name: its limit).
    pub fn limit_for(&self, tier: Option<&str>) -> Limit {
        tier.and_then(|t| self.tiers.iter().find(|(name, _)| name == t))
            .map_or(self.limit, |(_, limit)| *limit)
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
