//! A rule's `lease` (`"lease": {"tokens": 100, "ttl": "1s"}`): how many tokens beyond a
//! request's cost a worker asks for on a hot bucket, and how long it may hold them. What a
//! worker does with them is the filter's `lease` module; here is only what the
//! configuration may say, checked against the rule's limit.

use crate::error::{err, ConfigError};
use crate::limit::{duration_within, Limit};
use serde::Deserialize;

/// Longest lease.
pub const MAX_TTL_MS: u64 = 60_000;
/// A lease's life by default.
pub const DEFAULT_TTL_MS: u64 = 1_000;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLease {
    tokens: u64,
    ttl: Option<String>,
}

/// A rule's lease: how many tokens to ask for beyond the cost, and for how long to hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    pub tokens: u64,
    pub ttl_ms: u64,
}

impl RawLease {
    pub(crate) fn validate(self, field: &str, limit: &Limit) -> Result<LeasePolicy, ConfigError> {
        if !(1..=limit.burst).contains(&self.tokens) {
            return err(
                format!("{field}.tokens"),
                format!("must be 1 to the burst ({})", limit.burst),
            );
        }
        let ttl_ms = duration_within(
            &format!("{field}.ttl"),
            self.ttl.as_deref(),
            DEFAULT_TTL_MS,
            1..=MAX_TTL_MS,
            "like 500ms or 2s, of at most 1m",
        )?;
        Ok(LeasePolicy {
            tokens: self.tokens,
            ttl_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_second(burst: u64) -> Limit {
        Limit::new(burst, 1_000, None, 1).unwrap()
    }

    #[test]
    fn lease_settings_are_validated_against_the_limit() {
        let parse = |json: &str| {
            serde_json::from_str::<RawLease>(json)
                .unwrap()
                .validate("l", &per_second(100))
        };
        assert_eq!(
            parse(r#"{"tokens": 20}"#).unwrap(),
            LeasePolicy {
                tokens: 20,
                ttl_ms: DEFAULT_TTL_MS
            }
        );
        assert_eq!(
            parse(r#"{"tokens": 1, "ttl": "250ms"}"#).unwrap().ttl_ms,
            250
        );
        assert_eq!(parse(r#"{"tokens": 0}"#).unwrap_err().field, "l.tokens");
        assert_eq!(parse(r#"{"tokens": 101}"#).unwrap_err().field, "l.tokens");
        assert_eq!(
            parse(r#"{"tokens": 1, "ttl": "2m"}"#).unwrap_err().field,
            "l.ttl"
        );
    }
}
