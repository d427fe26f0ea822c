//! A rule's `global`: one budget across every region, kept by a ledger in one region's
//! Redis (the key's *home*) that leases its tokens to the regions' bridges, so that a
//! client spread over regions gets one limit, not one per region. What the configuration
//! may say; the leases themselves are the bridge's (`bridge/src/engine/regions/`), the ledger
//! `lua/ledger.lua`, and what the bound is docs/regions.md's.
//!
//! ```json
//! "global": {"home": "eu", "partition": {"share": 0.1}, "lease_ttl": "2s"}
//! ```

use crate::error::{err, ConfigError};
use crate::limit::duration_within;
use ratelimit_protocol::global::{
    valid_region, Global, MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS, SHARE_SCALE,
};
use serde::Deserialize;

/// A lease's life by default.
pub const DEFAULT_LEASE_TTL_MS: u64 = 2_000;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct RawGlobal {
    home: Option<String>,
    partition: Option<RawPartition>,
    lease_ttl: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(
    untagged,
    expecting = "partition: \"deny\", or {\"share\": a fraction of the limit each region keeps}"
)]
enum RawPartition {
    Word(String),
    Share { share: f64 },
}

impl RawGlobal {
    /// The global terms at `field` (a plugin rule's, or a rate limit service limit's, which
    /// the bridge reads), as a check carries them.
    pub fn validate(self, field: &str) -> Result<Global, ConfigError> {
        let home = match self.home {
            Some(home) if valid_region(&home) => home,
            Some(home) => {
                return err(
                    format!("{field}.home"),
                    format!(
                        "{home:?} is not a region's name: 1 to 32 lower-case letters, digits \
                         and -, as the bridges' --region names it"
                    ),
                )
            }
            None => String::new(),
        };
        let share_ppm = match self.partition {
            None => 0,
            Some(RawPartition::Word(word)) if word == "deny" => 0,
            Some(RawPartition::Word(word)) => {
                return err(
                    format!("{field}.partition"),
                    format!("{word:?}: \"deny\", or {{\"share\": F}}"),
                )
            }
            Some(RawPartition::Share { share }) => {
                let ppm = (share * SHARE_SCALE as f64).round();
                if !(share > 0.0 && share < 1.0) || ppm < 1.0 {
                    return err(
                        format!("{field}.partition.share"),
                        "a share is a fraction of the limit above 0 and below 1 (each region \
                         keeps it: the regions' shares together must stay below 1)",
                    );
                }
                ppm as u64
            }
        };
        let ttl_ms = duration_within(
            &format!("{field}.lease_ttl"),
            self.lease_ttl.as_deref(),
            DEFAULT_LEASE_TTL_MS,
            MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS,
            "from 100ms to 1m",
        )?;
        Ok(Global {
            home,
            share_ppm,
            ttl_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Global, ConfigError> {
        serde_json::from_str::<RawGlobal>(json)
            .unwrap()
            .validate("g")
    }

    #[test]
    fn global_terms_are_validated() {
        assert_eq!(
            parse("{}").unwrap(),
            Global {
                home: String::new(),
                share_ppm: 0,
                ttl_ms: DEFAULT_LEASE_TTL_MS
            }
        );
        let g = parse(r#"{"home": "eu-1", "partition": {"share": 0.1}, "lease_ttl": "500ms"}"#)
            .unwrap();
        assert_eq!(
            (g.home.as_str(), g.share_ppm, g.ttl_ms),
            ("eu-1", 100_000, 500)
        );
        assert_eq!(parse(r#"{"partition": "deny"}"#).unwrap().share_ppm, 0);
        for (bad, field) in [
            (r#"{"home": "EU"}"#, "g.home"),
            (r#"{"home": ""}"#, "g.home"),
            (r#"{"partition": "open"}"#, "g.partition"),
            (r#"{"partition": {"share": 0}}"#, "g.partition.share"),
            (r#"{"partition": {"share": 1}}"#, "g.partition.share"),
            (
                r#"{"partition": {"share": 0.0000001}}"#,
                "g.partition.share",
            ),
            (r#"{"lease_ttl": "50ms"}"#, "g.lease_ttl"),
            (r#"{"lease_ttl": "2m"}"#, "g.lease_ttl"),
        ] {
            assert_eq!(parse(bad).unwrap_err().field, field, "{bad}");
        }
    }
}
