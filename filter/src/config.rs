//! The plugin configuration: the JSON users write, and the validated form the filter runs on.
//!
//! Parsing is all-or-nothing: `Config::parse` either returns a complete configuration or an
//! error naming the offending field (`rules[2].limit.per: ...`), so a bad config is refused at
//! load and never half-applied.

use crate::backend::{Backend, RawBackend};
use crate::block::{BlockPolicy, RawBlock};
use crate::breaker::BreakerConfig;
pub use crate::config_error::ConfigError;
use crate::config_error::{err, plain};
use crate::deny_cache;
use crate::lease::{LeasePolicy, RawLease};
use crate::limit::{Limit, RawLimit};
pub use crate::matcher::Matcher;
use crate::matcher::{method_overrides, RawMatch};
use crate::scope::{RawScope, Scope, MAX_SCOPES};
use crate::source::RawIdentity;
pub use crate::source::{Address, Forwarded, Identity, Missing, Source};
use ratelimit_protocol::key;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Longest name (a key prefix, rule, identity or tier): the keys' grammar's.
pub use ratelimit_protocol::key::MAX_NAME_LEN;
/// Upper bound on rules per request: what one check of the wire format may carry.
pub use ratelimit_protocol::MAX_RULES;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    backend: RawBackend,
    #[serde(default)]
    failure_mode: FailureMode,
    #[serde(default = "default_prefix")]
    key_prefix: String,
    #[serde(default)]
    identity: BTreeMap<String, RawIdentity>,
    #[serde(default)]
    rules: Vec<RawRule>,
    /// Higress's matchRules (see `scope`).
    #[serde(default, rename = "_rules_")]
    scopes: Vec<RawScope<RawRule>>,
    #[serde(default)]
    headers: HeaderOptions,
    local_share: Option<f64>,
    local_buckets: Option<u64>,
    #[serde(default)]
    circuit_breaker: BreakerConfig,
    #[serde(default = "default_deny_cache_entries")]
    deny_cache_entries: u64,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    method_override: Vec<String>,
}

fn default_deny_cache_entries() -> u64 {
    deny_cache::DEFAULT_ENTRIES
}

fn default_prefix() -> String {
    "rl".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    #[serde(default)]
    key: Vec<String>,
    #[serde(default, rename = "match")]
    matcher: RawMatch,
    limit: RawLimit,
    #[serde(default = "default_cost")]
    cost: u64,
    #[serde(default)]
    tiers: BTreeMap<String, RawLimit>,
    #[serde(default = "default_tier_identity")]
    tier_identity: String,
    block: Option<RawBlock>,
    lease: Option<RawLease>,
    mode: Option<Mode>,
    missing: Option<Missing>,
}

fn default_cost() -> u64 {
    1
}

fn default_tier_identity() -> String {
    "tier".into()
}

/// Whether rules deny (`enforce`) or only count what they would deny (`shadow`: checks run
/// and take tokens as configured, the request always passes).
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
}

/// What to do when the backend cannot answer (unreachable, too slow, garbage reply).
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Reply 503 with `Retry-After`: no request passes unchecked.
    #[default]
    Closed,
    /// Let the request through unchecked.
    Open,
    /// Enforce `local_share` of each limit with this gateway's own buckets.
    Local,
}

/// Which rate-limit headers the filter adds.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderOptions {
    /// Add `X-RateLimit-*` to allowed responses too (they are always on 429s).
    pub on_allowed: bool,
    /// Also emit the IETF draft-11 `RateLimit-Policy` and `RateLimit` fields, and refuse
    /// with its problem types.
    pub ietf_draft: bool,
}

impl Default for HeaderOptions {
    fn default() -> Self {
        HeaderOptions {
            on_allowed: true,
            ietf_draft: false,
        }
    }
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    /// Indexes into `Config::identities` whose values make up the bucket key.
    pub key: Vec<usize>,
    /// For each of `key`, what to do with a request that lacks it: the rule's `missing`,
    /// else the identity's.
    pub missing: Vec<Missing>,
    pub matcher: Matcher,
    pub limit: Limit,
    /// Tokens one request takes.
    pub cost: u64,
    /// Index of the identity whose value selects a tier, when the rule has tiers.
    pub tier_identity: Option<usize>,
    /// Tier value → limit used instead of `limit` for clients of that tier.
    pub tiers: Vec<(String, Limit)>,
    /// Block clients denied too often.
    pub block: Option<BlockPolicy>,
    /// Lease tokens of a hot bucket to the worker.
    pub lease: Option<LeasePolicy>,
    /// Shadow mode (the rule's or the whole plugin's): never denies.
    pub shadow: bool,
    /// The `_rules_` entry (`Config::scopes`) the rule belongs to; `None`: a top-level rule.
    pub scope: Option<usize>,
}

/// Local buckets per rule by default (`failure_mode: "local"`).
pub const DEFAULT_BUCKETS: u64 = 1024;
/// Most local buckets per rule (each costs shared data once touched: about 60 bytes).
pub const MAX_BUCKETS: u64 = 65_536;

/// How the local failure mode divides the global limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalOptions {
    /// The share of each global limit one gateway enforces alone.
    pub share: f64,
    /// Buckets per rule that clients hash into.
    pub buckets: u64,
}

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub backend: Backend,
    pub failure_mode: FailureMode,
    pub key_prefix: String,
    pub identities: Vec<Identity>,
    /// The top-level rules, then each `_rules_` entry's (`Rule::scope`).
    pub rules: Vec<Rule>,
    /// Higress's matchRules: which routes or domains have rules of their own.
    pub scopes: Vec<Scope>,
    /// Some rule matches on `:method` or `:path`: only then are they read and the path
    /// normalized, per request.
    pub matches_requests: bool,
    pub headers: HeaderOptions,
    /// With `failure_mode: "local"`: the share of each limit enforced alone, and how many
    /// buckets per rule clients hash into.
    pub local: LocalOptions,
    pub circuit_breaker: BreakerConfig,
    /// Most entries of a worker's deny cache (0: off).
    pub deny_cache_entries: u64,
    /// The whole plugin is in shadow mode: every rule is.
    pub shadow: bool,
    /// Headers that name the method the upstream serves a request as, such as
    /// `x-http-method-override` (lower case): a rule on methods matches those too.
    pub method_override: Vec<String>,
}

impl Config {
    /// The name of rule `index` (a `PlannedRule::rule`); empty for an index it has not.
    pub fn rule_name(&self, index: usize) -> &str {
        self.rules.get(index).map_or("", |r| r.name.as_str())
    }

    /// Parses and validates a plugin configuration.
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(json);
        let raw: RawConfig = match serde_path_to_error::deserialize(de) {
            Ok(raw) => raw,
            Err(e) => {
                let path = e.path().to_string();
                let field = if path == "." { "config".into() } else { path };
                return err(field, plain(&e.into_inner().to_string()));
            }
        };
        raw.validate()
    }

    /// Position of the identity called `name`.
    fn identity_index(&self, name: &str) -> Option<usize> {
        self.identities.iter().position(|i| i.name == name)
    }
}

/// Names end up in Redis keys and headers: keep them to a small, safe alphabet.
fn check_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return err(field, format!("must be 1 to {MAX_NAME_LEN} characters"));
    }
    if !name.bytes().all(key::is_name_byte) {
        return err(
            field,
            format!("{name:?} may only hold letters, digits, '-', '_' and '.'"),
        );
    }
    Ok(())
}

impl RawConfig {
    fn validate(self) -> Result<Config, ConfigError> {
        let backend = self.backend.validate()?;
        check_name("key_prefix", &self.key_prefix)?;
        let local_share = match (self.failure_mode, self.local_share) {
            (FailureMode::Local, None) => 1.0,
            (FailureMode::Local, Some(share)) if share > 0.0 && share <= 1.0 => share,
            (FailureMode::Local, Some(_)) => {
                return err(
                    "local_share",
                    "must be above 0 and at most 1 (e.g. 0.25 for four gateways)",
                )
            }
            (_, Some(_)) => {
                return err("local_share", "only applies to \"failure_mode\": \"local\"")
            }
            (_, None) => 1.0,
        };
        let local_buckets = match (self.failure_mode, self.local_buckets) {
            (FailureMode::Local, Some(n)) if !(1..=MAX_BUCKETS).contains(&n) => {
                return err(
                    "local_buckets",
                    format!("must be between 1 and {MAX_BUCKETS}"),
                )
            }
            (FailureMode::Local, n) => n.unwrap_or(DEFAULT_BUCKETS),
            (_, Some(_)) => {
                return err(
                    "local_buckets",
                    "only applies to \"failure_mode\": \"local\"",
                )
            }
            (_, None) => DEFAULT_BUCKETS,
        };
        let breaker = self.circuit_breaker;
        if breaker.failures > 0
            && (breaker.open_ms == 0 || breaker.max_open_ms.is_some_and(|m| m < breaker.open_ms))
        {
            return err(
                "circuit_breaker",
                "needs open_ms >= 1 and max_open_ms >= open_ms",
            );
        }
        if self.deny_cache_entries > deny_cache::MAX_ENTRIES {
            return err(
                "deny_cache_entries",
                format!("must be at most {}", deny_cache::MAX_ENTRIES),
            );
        }
        let method_override = method_overrides(self.method_override)?;
        let mut identities = Vec::with_capacity(self.identity.len());
        for (name, raw) in self.identity {
            let field = format!("identity.{name}");
            check_name(&field, &name)?;
            identities.push(raw.validate(name, &field)?);
        }
        let mut config = Config {
            backend,
            failure_mode: self.failure_mode,
            key_prefix: self.key_prefix,
            identities,
            rules: Vec::new(),
            scopes: Vec::new(),
            matches_requests: false,
            headers: self.headers,
            local: LocalOptions {
                share: local_share,
                buckets: local_buckets,
            },
            circuit_breaker: breaker,
            deny_cache_entries: self.deny_cache_entries,
            shadow: self.mode == Mode::Shadow,
            method_override,
        };
        if self.rules.is_empty() && self.scopes.is_empty() {
            return err("rules", "at least one rule is needed");
        }
        config.add_rules("rules", self.rules, None)?;
        if self.scopes.len() > MAX_SCOPES {
            return err("_rules_", format!("at most {MAX_SCOPES} entries"));
        }
        for (i, raw) in self.scopes.into_iter().enumerate() {
            let field = format!("_rules_[{i}]");
            config.scopes.push(raw.scope(&field)?);
            if raw.rules.is_empty() {
                return err(format!("{field}.rules"), "at least one rule is needed");
            }
            config.add_rules(&format!("{field}.rules"), raw.rules, Some(i))?;
        }
        Ok(config)
    }
}

impl Config {
    /// Validates and adds one list of rules (the top-level `rules`, or a `_rules_` entry's).
    /// Names are unique across all lists: they key the buckets and name the metrics.
    fn add_rules(
        &mut self,
        field: &str,
        raw: Vec<RawRule>,
        scope: Option<usize>,
    ) -> Result<(), ConfigError> {
        if raw.len() > MAX_RULES {
            return err(field, format!("at most {MAX_RULES} rules are supported"));
        }
        for (i, raw) in raw.into_iter().enumerate() {
            let mut rule = raw.validate(&format!("{field}[{i}]"), self)?;
            if self.rules.iter().any(|r| r.name == rule.name) {
                return err(
                    format!("{field}[{i}].name"),
                    format!("{:?} is used twice", rule.name),
                );
            }
            rule.scope = scope;
            self.matches_requests |= rule.matcher != Matcher::default();
            self.rules.push(rule);
        }
        Ok(())
    }
}

impl RawRule {
    fn validate(self, field: &str, config: &Config) -> Result<Rule, ConfigError> {
        check_name(&format!("{field}.name"), &self.name)?;
        let mut key = Vec::with_capacity(self.key.len());
        for (i, name) in self.key.iter().enumerate() {
            let Some(index) = config.identity_index(name) else {
                return err(
                    format!("{field}.key[{i}]"),
                    format!("no identity named {name:?}"),
                );
            };
            if key.contains(&index) {
                return err(
                    format!("{field}.key[{i}]"),
                    format!("{name:?} is listed twice"),
                );
            }
            key.push(index);
        }
        if key.is_empty() && self.missing.is_some() {
            return err(
                format!("{field}.missing"),
                "only applies to a rule with a key",
            );
        }
        let of_identity = |id: usize| config.identities.get(id).map(|i| i.missing);
        let missing = (key.iter())
            .map(|&id| self.missing.or(of_identity(id)).unwrap_or_default())
            .collect();
        let matcher = self.matcher.validate(&format!("{field}.match"))?;
        if self.cost == 0 {
            return err(format!("{field}.cost"), "must be at least 1");
        }
        let limit = self.limit.validate(&format!("{field}.limit"), self.cost)?;
        let mut tiers = Vec::with_capacity(self.tiers.len());
        for (tier, raw) in self.tiers {
            check_name(&format!("{field}.tiers"), &tier)?;
            tiers.push((
                tier.clone(),
                raw.validate(&format!("{field}.tiers.{tier}"), self.cost)?,
            ));
        }
        let tier_identity = if tiers.is_empty() {
            None
        } else {
            match config.identity_index(&self.tier_identity) {
                Some(index) if config.identities.get(index).is_some_and(|i| i.trusted) => {
                    Some(index)
                }
                Some(_) => {
                    return err(
                        format!("{field}.tier_identity"),
                        format!(
                            "identity {:?} is a value the client writes itself, so a client \
                             could pick its own tier: use a verified JWT claim, or mark the \
                             identity \"trusted\": true if a filter before this one sets it \
                             (and drops what the client sent)",
                            self.tier_identity
                        ),
                    )
                }
                None => {
                    return err(
                        format!("{field}.tier_identity"),
                        format!("tiers need an identity named {:?}", self.tier_identity),
                    )
                }
            }
        };
        let block = match self.block {
            Some(raw) => Some(raw.validate(&format!("{field}.block"))?),
            None => None,
        };
        let lease = match self.lease {
            Some(raw) => Some(raw.validate(&format!("{field}.lease"), &limit)?),
            None => None,
        };
        let shadow = config.shadow || self.mode == Some(Mode::Shadow);
        Ok(Rule {
            name: self.name,
            key,
            missing,
            matcher,
            limit,
            cost: self.cost,
            tier_identity,
            tiers,
            block,
            lease,
            shadow,
            scope: None,
        })
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "config_cases_tests.rs"]
mod cases;
