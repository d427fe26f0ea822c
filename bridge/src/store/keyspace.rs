//! Which Redis keys the bridge may touch: only keys a gateway makes (the keys' grammar,
//! `ratelimit_protocol::key`: `prefix:rule[:value...]`, values escaped as the filter
//! escapes them), under its configured prefixes (`--key-prefix`, default `rl`). Whoever
//! reaches the bridge can name any key in a check; without this bound a caller could
//! overwrite or expire any key of a shared Redis (sessions, queues), or the bridge's own
//! records under a prefix (`{overrides}`, which no rule name can spell), not only buckets.
//! Nor the rate limit service's buckets (rule `rls`, `ratelimit_config::keys::SERVICE_RULE`):
//! this bound is the gateways' wire's, and no gateway's rule may bear that name.

use crate::store::check::Check;
use ratelimit_config::keys::SERVICE_RULE;
pub use ratelimit_protocol::key::is_name;
use ratelimit_protocol::key::parse_key;

/// The default prefix, the filter's default `key_prefix`.
pub const DEFAULT_PREFIX: &str = "rl";

/// The prefixes whose bucket keys (`prefix:rule[:value...]`) the bridge may read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    prefixes: Vec<String>,
}

impl Default for Keyspace {
    fn default() -> Keyspace {
        Keyspace {
            prefixes: vec![DEFAULT_PREFIX.into()],
        }
    }
}

impl Keyspace {
    /// Parses a comma-separated list of prefixes, each 1 to 64 of `[A-Za-z0-9._-]` (the
    /// characters the filter allows in its `key_prefix`).
    pub fn parse(list: &str) -> Result<Keyspace, String> {
        let mut prefixes = Vec::new();
        for prefix in list.split(',').map(str::trim) {
            if !is_name(prefix) {
                return Err(format!(
                    "{prefix:?} is not a key prefix (1 to 64 letters, digits, '.', '_' or '-')"
                ));
            }
            prefixes.push(prefix.to_string());
        }
        Ok(Keyspace { prefixes })
    }

    /// The prefixes.
    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.prefixes.iter().map(String::as_str)
    }

    /// Why `check` may not run, if one of its keys is no key a gateway makes or lies outside
    /// every prefix.
    pub fn refusal(&self, check: &Check) -> Option<String> {
        check.iter().find_map(|rule| {
            let why = match parse_key(&rule.key) {
                Err(why) => format!("is no key a gateway makes ({why})"),
                Ok(key) if !self.prefixes.iter().any(|p| p == key.prefix) => {
                    "is outside the bridge's key prefixes".into()
                }
                Ok(key) if key.rule == SERVICE_RULE => {
                    format!("is the rate limit service's (rule {SERVICE_RULE:?}), not a gateway's")
                }
                Ok(_) => return None,
            };
            let shown: String = rule.key.chars().take(64).collect();
            Some(format!("key {shown:?} {why}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::check::RuleSpec;

    fn check(keys: &[&str]) -> Check {
        keys.iter()
            .map(|&key| RuleSpec::plain(key, 1, 1, 1, 1))
            .collect()
    }

    #[test]
    fn only_keys_under_a_prefix_are_admitted() {
        let keys = Keyspace::parse("rl, edge").unwrap();
        assert_eq!(keys.refusal(&check(&["rl:a", "edge:b:c"])), None);
        for bad in ["session:42", "rl", "rlx:a", "edg:a", "RL:a", ":rl:a"] {
            let refusal = keys.refusal(&check(&["rl:ok", bad]));
            assert!(refusal.is_some_and(|r| r.contains(bad)), "{bad}");
        }
        assert_eq!(Keyspace::default(), Keyspace::parse("rl").unwrap());
    }

    #[test]
    fn keys_no_gateway_makes_are_refused_under_a_prefix_too() {
        let keys = Keyspace::default();
        for bad in [
            "rl:{overrides}",
            "rl:{overrides}:r:bob",
            "rl:r:a b",
            "rl:r:",
        ] {
            let refusal = keys.refusal(&check(&["rl:ok", bad])).unwrap_or_default();
            assert!(
                refusal.contains("is no key a gateway makes"),
                "{bad}: {refusal}"
            );
        }
    }

    /// A gateway's client reaching an RLS client's bucket (`rl:rls:<domain>:<key>:<value>`)
    /// through the gateways' wire: refused, whatever sent it.
    #[test]
    fn the_rate_limit_services_buckets_are_no_gateways() {
        let keys = Keyspace::default();
        let refusal = keys
            .refusal(&check(&["rl:ok", "rl:rls:d:k:v"]))
            .unwrap_or_default();
        assert!(refusal.contains("rate limit service's"), "{refusal}");
        assert_eq!(keys.refusal(&check(&["rl:RLS:d:k:v", "rl:rls2:a"])), None);
    }

    #[test]
    fn bad_prefixes_are_refused() {
        for bad in ["", "rl,", "a:b", "a b", "{rl}", &"p".repeat(65)] {
            assert!(Keyspace::parse(bad).is_err(), "{bad:?}");
        }
    }
}
