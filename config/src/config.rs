//! The plugin configuration: the JSON users write, and the validated form the filter runs on.
//!
//! Parsing is all-or-nothing: `Config::parse` either returns a complete configuration or an
//! error naming the offending field (`rules[2].limit.per: ...`), so a bad config is refused at
//! load and never half-applied.

use crate::backend::{Backend, RawBackend, Transport};
use crate::error::{err, plain, ConfigError};
use crate::json_path;
use crate::keys::validate_name;
use crate::matcher::{method_overrides, Matcher};
use crate::options::{self, BreakerConfig, FailureMode, HeaderOptions, LocalOptions, Mode};
use crate::quota_api::{QuotaApi, RawQuotaApi};
use crate::rule::{RawRule, Rule};
use crate::scope::{RawScope, Scope, MAX_SCOPES};
use crate::source::{Identity, RawIdentity, Source};
use ratelimit_protocol::MAX_RULES;
use serde::Deserialize;
use std::collections::BTreeMap;

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
    quota_api: Option<RawQuotaApi>,
}

fn default_deny_cache_entries() -> u64 {
    options::DEFAULT_DENY_CACHE_ENTRIES
}

fn default_prefix() -> String {
    "rl".into()
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
    /// Where a client reads its own quota (the gateway answers it).
    pub quota_api: Option<QuotaApi>,
}

impl Config {
    /// A request keyed on a body field is read for every body field any rule or identity
    /// names (which rules apply is known only after): with a body identity, they must fit
    /// one reading.
    fn body_fields_fit(&self) -> Result<(), ConfigError> {
        let mut fields: Vec<&Vec<String>> = Vec::new();
        let reserves = self.rules.iter().filter_map(|r| r.meter.as_ref());
        let identities = self.identities.iter().filter_map(|i| match &i.source {
            Source::Body(path) => Some(path),
            _ => None,
        });
        let mut identities = identities.peekable();
        if identities.peek().is_none() {
            return Ok(());
        }
        for field in reserves.flat_map(|m| &m.reserve_body).chain(identities) {
            if !fields.contains(&field) {
                fields.push(field);
            }
        }
        if fields.len() > MAX_BODY_FIELDS {
            return err(
                "identity",
                format!(
                    "the rules' reserve.body fields and the body identities name {} fields \
                     of a request's body: at most {MAX_BODY_FIELDS}",
                    fields.len()
                ),
            );
        }
        Ok(())
    }

    /// The name of rule `index` (a `PlannedRule::rule`); empty for an index it has not.
    pub fn rule_name(&self, index: usize) -> &str {
        self.rules.get(index).map_or("", |r| r.name.as_str())
    }

    /// Parses and validates a plugin configuration.
    ///
    /// `#[inline]` so that the JSON deserializer's generic code is instantiated in the
    /// crate that calls this, not here: in the filter, beside the same instantiations for
    /// its JWT reader, one copy of each in the .wasm rather than one per crate (measured:
    /// ratelimit.wasm 4.8 KB smaller than with `parse` and `load` instantiated here).
    #[inline]
    pub fn parse(json: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = match serde_json::from_slice(json) {
            Ok(raw) => raw,
            Err(e) => {
                let field = json_path::at(json, e.line(), e.column());
                return err(field.as_deref().unwrap_or("config"), plain(&e.to_string()));
            }
        };
        raw.validate()
    }
}

impl RawConfig {
    /// `#[inline]` with `Config::parse`, whose `RawConfig` it takes apart: the drop code of
    /// what is left is then made in the same crate as the rest of the parse.
    #[inline]
    fn validate(self) -> Result<Config, ConfigError> {
        let backend = self.backend.validate()?;
        validate_name("key_prefix", &self.key_prefix)?;
        let local =
            LocalOptions::validate(self.failure_mode, self.local_share, self.local_buckets)?;
        let circuit_breaker = self.circuit_breaker.validate()?;
        let deny_cache_entries = options::deny_cache_entries(self.deny_cache_entries)?;
        let method_override = method_overrides(self.method_override)?;
        let quota_api = match self.quota_api {
            Some(raw) => Some(raw.validate("quota_api")?),
            None => None,
        };
        let mut identities = Vec::with_capacity(self.identity.len());
        for (name, raw) in self.identity {
            let field = format!("identity.{name}");
            validate_name(&field, &name)?;
            identities.push(raw.validate(name, &field)?);
        }
        let mut config = Config {
            backend,
            failure_mode: self.failure_mode,
            key_prefix: self.key_prefix,
            identities,
            rules: Vec::new(),
            scopes: Vec::new(),
            headers: self.headers,
            local,
            circuit_breaker,
            deny_cache_entries,
            shadow: self.mode == Mode::Shadow,
            method_override,
            // The quota API's path is compared with each request's, normalized.
            matches_requests: quota_api.is_some(),
            quota_api,
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
        config.body_fields_fit()?;
        Ok(config)
    }
}

/// Most distinct fields of a request's body the rules and identities read, together: what
/// the gateway's one pass over a held body follows.
pub const MAX_BODY_FIELDS: usize = 16;

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
            let mut rule = raw.validate(&format!("{field}[{i}]"), &self.identities, self.shadow)?;
            if rule.global.is_some() && self.backend.transport == Transport::Redis {
                return err(
                    format!("{field}[{i}].global"),
                    "a global rule's budget is leased by the bridges of its regions: it \
                     needs backend.cluster (a bridge), not backend.redis",
                );
            }
            if rule.time_zone.is_some() && self.backend.transport == Transport::Redis {
                return err(
                    format!("{field}[{i}].time_zone"),
                    "a calendar quota's periods start where the bridge's time zone database \
                     says: it needs backend.cluster (a bridge), not backend.redis",
                );
            }
            if rule.time_zone.is_some() && self.failure_mode == FailureMode::Local {
                return err(
                    format!("{field}[{i}].limit"),
                    "a gateway alone cannot count a period's quota that every gateway spends: \
                     choose failure_mode \"open\" or \"closed\" for a configuration with \
                     calendar quotas",
                );
            }
            if rule.in_flight.is_some() && self.failure_mode == FailureMode::Local {
                return err(
                    format!("{field}[{i}].in_flight"),
                    "a gateway alone cannot count what every gateway has in flight: choose \
                     failure_mode \"open\" or \"closed\" for a configuration with in_flight \
                     rules",
                );
            }
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

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "config_cases_tests.rs"]
mod cases;
