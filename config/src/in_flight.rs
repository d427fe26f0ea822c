//! A rule's `in_flight` (`"in_flight": {"max": 20, "ttl": "30s"}`): how many requests of one
//! key may be in flight at once, across every gateway and worker. Each admitted request
//! holds a slot until its stream ends; a slot no one renews (its gateway died) lives `ttl`
//! at most. What the filter does with slots is its `slots` module; here is only what the
//! configuration may say.

use crate::error::{err, ConfigError};
use crate::limit::{duration_within, Limit};
use ratelimit_protocol::slot::{MAX_SLOT_TTL_MS, MIN_SLOT_TTL_MS};
use serde::Deserialize;

/// A slot's life between renewals by default.
pub const DEFAULT_TTL_MS: u64 = 30_000;

/// As the configuration writes it (the rate limit service's YAML writes it so too).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawInFlight {
    max: u64,
    ttl: Option<String>,
}

/// An in-flight rule's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Most requests of one key in flight at once.
    pub max: u64,
    /// How long a slot lives unless renewed: its request's gateway renews it every third of
    /// this while the request lives.
    pub ttl_ms: u64,
}

impl InFlight {
    /// The limit the rule's slots travel with: `max` slots (the burst), one per request.
    /// The rate is never used (slots come back when requests end), only kept exact.
    pub fn limit(&self) -> Result<Limit, (&'static str, String)> {
        Limit::new(self.max, self.ttl_ms, Some(self.max), 1)
    }
}

impl RawInFlight {
    pub fn validate(self, field: &str) -> Result<InFlight, ConfigError> {
        if !(1..=1_000_000).contains(&self.max) {
            return err(format!("{field}.max"), "must be 1 to 1000000");
        }
        let ttl_ms = duration_within(
            &format!("{field}.ttl"),
            self.ttl.as_deref(),
            DEFAULT_TTL_MS,
            MIN_SLOT_TTL_MS..=MAX_SLOT_TTL_MS,
            "like 10s or 1m, from 1s to 1h",
        )?;
        let in_flight = InFlight {
            max: self.max,
            ttl_ms,
        };
        match in_flight.limit() {
            Ok(_) => Ok(in_flight),
            Err((_, problem)) => err(field.to_string(), problem),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validated(max: u64, ttl: Option<&str>) -> Result<InFlight, ConfigError> {
        RawInFlight {
            max,
            ttl: ttl.map(String::from),
        }
        .validate("f")
    }

    #[test]
    fn terms_are_read_with_a_default_life() {
        assert_eq!(
            validated(20, None),
            Ok(InFlight {
                max: 20,
                ttl_ms: DEFAULT_TTL_MS
            })
        );
        assert_eq!(validated(1, Some("1s")).map(|f| f.ttl_ms), Ok(1_000));
        assert_eq!(validated(1, Some("1h")).map(|f| f.ttl_ms), Ok(3_600_000));
    }

    #[test]
    fn bad_terms_are_refused_naming_their_field() {
        let field = |r: Result<InFlight, ConfigError>| r.map_err(|e| e.field);
        assert_eq!(field(validated(0, None)), Err("f.max".into()));
        assert_eq!(field(validated(1_000_001, None)), Err("f.max".into()));
        for ttl in ["999ms", "2h", "0s", "soon"] {
            assert_eq!(field(validated(5, Some(ttl))), Err("f.ttl".into()), "{ttl}");
        }
    }

    #[test]
    fn slots_travel_as_a_burst_of_max() {
        let limit = validated(7, Some("10s")).and_then(|f| {
            f.limit().map_err(|(field, problem)| ConfigError {
                field: field.into(),
                problem,
            })
        });
        assert_eq!(limit.map(|l| l.burst), Ok(7));
    }
}
