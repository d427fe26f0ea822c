//! The plugin-wide options: shadow mode, the failure mode and its local buckets, the
//! headers, the circuit breaker and the deny cache's size. Each is one field of the
//! configuration's top level, validated on its own, with its bounds beside it.

use crate::error::{err, ConfigError};
use serde::Deserialize;

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

impl LocalOptions {
    /// `local_share` and `local_buckets` as given (`None`: absent), which only
    /// `failure_mode: "local"` may give; the defaults otherwise.
    pub(crate) fn validate(
        failure_mode: FailureMode,
        share: Option<f64>,
        buckets: Option<u64>,
    ) -> Result<LocalOptions, ConfigError> {
        let local = failure_mode == FailureMode::Local;
        let share = match share {
            Some(share) if local && share > 0.0 && share <= 1.0 => share,
            Some(_) if local => {
                return err(
                    "local_share",
                    "must be above 0 and at most 1 (e.g. 0.25 for four gateways)",
                )
            }
            Some(_) => return err("local_share", "only applies to \"failure_mode\": \"local\""),
            None => 1.0,
        };
        let buckets = match buckets {
            Some(n) if local && !(1..=MAX_BUCKETS).contains(&n) => {
                return err(
                    "local_buckets",
                    format!("must be between 1 and {MAX_BUCKETS}"),
                )
            }
            Some(n) if local => n,
            Some(_) => {
                return err(
                    "local_buckets",
                    "only applies to \"failure_mode\": \"local\"",
                )
            }
            None => DEFAULT_BUCKETS,
        };
        Ok(LocalOptions { share, buckets })
    }
}

/// The circuit breaker (`circuit_breaker`): when a worker's breaker opens and for how long.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker; 0 turns it off.
    pub failures: u32,
    /// First open interval; each failed probe doubles it, up to `max_open_ms`.
    pub open_ms: u64,
    /// Ceiling of the doubling; none (the default): `open_ms`, no doubling, so that a
    /// worker probes every `open_ms` however long the outage and recovers within that of
    /// the backend answering again (a doubling to 30 s kept gateways failing for 21 s
    /// after Redis was back).
    pub max_open_ms: Option<u64>,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            open_ms: 1_000,
            max_open_ms: None,
        }
    }
}

impl BreakerConfig {
    /// A breaker that opens must stay open a while, and its ceiling must not be below its
    /// first interval.
    pub(crate) fn validate(self) -> Result<BreakerConfig, ConfigError> {
        if self.failures > 0
            && (self.open_ms == 0 || self.max_open_ms.is_some_and(|m| m < self.open_ms))
        {
            return err(
                "circuit_breaker",
                "needs open_ms >= 1 and max_open_ms >= open_ms",
            );
        }
        Ok(self)
    }
}

/// Entries per worker's deny cache by default (`deny_cache_entries`); each costs its key
/// (at most `MAX_KEY_LEN` bytes, typically a few dozen) and about 80 bytes more.
pub const DEFAULT_DENY_CACHE_ENTRIES: u64 = 10_000;
/// Most entries per worker's deny cache that may be configured.
pub const MAX_DENY_CACHE_ENTRIES: u64 = 1_000_000;

/// `deny_cache_entries`, within its bound (0 turns the cache off).
pub(crate) fn deny_cache_entries(entries: u64) -> Result<u64, ConfigError> {
    if entries > MAX_DENY_CACHE_ENTRIES {
        return err(
            "deny_cache_entries",
            format!("must be at most {MAX_DENY_CACHE_ENTRIES}"),
        );
    }
    Ok(entries)
}
