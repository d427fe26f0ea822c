//! Emergency overrides: a limit that replaces a rule's configured one, for one client or
//! for every client of the rule, until it expires, without touching any gateway's
//! configuration. This module is what an override is; `records` is where its record lives
//! in Redis and how it is written there, and `table` the table the bridge rewrites checks
//! with, all pure; `registry` reads and writes the records, and `cache` keeps the table
//! fresh.
//!
//! The bridge finds the overrides, the script runs them: a check whose bucket key has an
//! override is sent to the script with the override's burst, rate and end beside the
//! limit the gateway sent (`ratelimit_protocol::Overridden`). The override's own bucket
//! then decides, and the rule's bucket still pays what is admitted (never below 0), so
//! that an override that ends leaves the client where its rule would have. A per-client
//! override names one bucket key exactly (`rl:per-user:alice`); a rule-wide one covers
//! every key of the rule (`rl:per-user`, then `:` or the end). A per-client override wins
//! over a rule-wide one.
//!
//! - `records`: an override's record and its prefix's index: their keys and their values.
//! - `table`: the overrides in force, found by bucket key and put on a check's rules.
//! - `cache`: the table this bridge applies, and the bound on its staleness.
//! - `registry`: the records in Redis: set, clear, list, and the refresh every 250 ms.

pub mod cache;
pub mod records;
pub mod registry;
pub mod table;

use crate::store::keyspace::is_name;
use ratelimit_config::keys::{self, bucket_key, SERVICE_RULE};
use ratelimit_config::limit::{parse_duration_ms, Limit};

/// Which buckets an override applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub prefix: String,
    pub rule: String,
    /// The bucket key (per client), or `<prefix>:<rule>` (the whole rule).
    pub key: String,
}

impl Target {
    /// The buckets of `rule` under `prefix` for the client whose identity values are
    /// `values` as a gateway sees them (escaped as the gateway escapes them), or every
    /// bucket of the rule when `values` is empty.
    pub fn new(prefix: &str, rule: &str, values: &[String]) -> Result<Target, String> {
        if !is_name(prefix) {
            return Err(format!(
                "key prefix {prefix:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
            ));
        }
        if !is_name(rule) {
            return Err(format!(
                "rule {rule:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
            ));
        }
        if rule == SERVICE_RULE {
            return Err(format!(
                "rule {rule:?} is the rate limit service's: name its buckets by --domain and \
                 --entry"
            ));
        }
        let escaped = values
            .iter()
            .map(|v| keys::typed(v).ok_or_else(|| format!("value {v:?} is empty")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Target {
            prefix: prefix.into(),
            rule: rule.into(),
            key: bucket_key(prefix, rule, &escaped),
        })
    }

    /// What names the target in its record and in the index: the key without `prefix:`.
    pub fn member(&self) -> &str {
        self.key.get(self.prefix.len() + 1..).unwrap_or_default()
    }

    /// Whether it covers every client of the rule.
    pub fn rule_wide(&self) -> bool {
        !self.member().contains(':')
    }

    /// What it covers: a plugin rule's every client (`rule`) or one client (`client`); the
    /// rate limit service's whole domain (`domain`) or what a descriptor's leading entries
    /// name (`descriptor`).
    pub fn scope(&self) -> &'static str {
        match (
            self.rule == SERVICE_RULE,
            self.member().matches(':').count(),
        ) {
            (true, 1) => "domain",
            (true, _) => "descriptor",
            (false, 0) => "rule",
            (false, _) => "client",
        }
    }
}

/// An active override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub target: Target,
    pub limit: Limit,
    /// Redis time (Unix ms) at which it expires.
    pub expires_ms: u64,
}

impl Override {
    /// As operators see it (`override list`, `usage`, the admin endpoints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "key": self.target.key,
            "rule": self.target.rule,
            "scope": self.target.scope(),
            "requests": self.limit.requests,
            "per_ms": self.limit.per_ms,
            "burst": self.limit.burst,
            "expires": self.expires_ms.div_ceil(1000),
        })
    }
}

/// The longest an override may last: a year. An emergency limit is not a configuration,
/// and every expiry stays an exact integer in Redis's milliseconds.
pub const MAX_TTL_MS: u64 = 365 * 86_400_000;

/// `requests` per `per` with a bucket of `burst` (default `requests`), lasting `ttl` (at
/// most `MAX_TTL_MS`): the limit and the lifetime in ms, validated as the plugin validates
/// its limits.
pub fn parse_spec(
    requests: u64,
    per: &str,
    burst: Option<u64>,
    ttl: &str,
) -> Result<(Limit, u64), String> {
    let duration = |name: &str, text: &str| {
        parse_duration_ms(text).ok_or_else(|| {
            format!("{name}: {text:?} is not a duration like 500ms, 10s, 1m, 1h or 1d")
        })
    };
    let per_ms = duration("per", per)?;
    let ttl_ms = duration("ttl", ttl)?;
    if ttl_ms > MAX_TTL_MS {
        return Err(format!(
            "ttl: {ttl:?} is longer than an override may last (365d)"
        ));
    }
    let limit =
        Limit::new(requests, per_ms, burst, 1).map_err(|(field, why)| format!("{field}: {why}"))?;
    Ok((limit, ttl_ms))
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
