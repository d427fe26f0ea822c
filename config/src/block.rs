//! A rule's automatic blocklist (`"block": {"after": 10, "within": "1m", "for": "15m"}`):
//! a client denied `after` times within `within` is refused on every gateway for `for`,
//! without taking tokens. The state lives in Redis, in the bucket's own value, set by the
//! same script call that denies; each worker trusts a block it learned for a second at most
//! (the filter's `deny_cache`), so that one an operator lifts (`ratelimit-bridge unblock`)
//! is lifted everywhere.

use crate::error::{err, ConfigError};
use crate::limit::parse_duration_ms;
pub use ratelimit_protocol::Block;
use serde::Deserialize;

/// Most denials a block may wait for.
pub const MAX_AFTER: u64 = 1_000_000;
/// Longest window and block: 30 days.
pub const MAX_DURATION_MS: u64 = 30 * 86_400_000;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBlock {
    after: u64,
    within: String,
    #[serde(rename = "for")]
    duration: String,
    #[serde(default = "default_status")]
    status: u32,
}

fn default_status() -> u32 {
    429
}

/// A validated block: what the script is told, and the status a blocked client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockPolicy {
    pub wire: Block,
    pub status: u32,
}

impl RawBlock {
    pub(crate) fn validate(self, field: &str) -> Result<BlockPolicy, ConfigError> {
        if !(1..=MAX_AFTER).contains(&self.after) {
            return err(
                format!("{field}.after"),
                format!("must be 1 to {MAX_AFTER} denials"),
            );
        }
        let duration = |name: &str, text: &str| match parse_duration_ms(text) {
            Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
            _ => err(
                format!("{field}.{name}"),
                format!("{text:?} is not a duration like 30s, 1m, 15m or 1h, of at most 30d"),
            ),
        };
        let within_ms = duration("within", &self.within)?;
        let for_ms = duration("for", &self.duration)?;
        if !(400..=599).contains(&self.status) {
            return err(
                format!("{field}.status"),
                "must be an HTTP error status, 400 to 599 (429 by default, 403 to say forbidden)",
            );
        }
        Ok(BlockPolicy {
            wire: Block {
                after: self.after,
                within_ms,
                for_ms,
            },
            status: self.status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(json: &str) -> Result<BlockPolicy, ConfigError> {
        serde_json::from_str::<RawBlock>(json)
            .unwrap()
            .validate("b")
    }

    #[test]
    fn a_block_reads_its_durations_and_defaults_to_429() {
        let b = block(r#"{"after": 10, "within": "1m", "for": "15m"}"#).unwrap();
        assert_eq!(
            b.wire,
            Block {
                after: 10,
                within_ms: 60_000,
                for_ms: 900_000
            }
        );
        assert_eq!(b.status, 429);
        let forbidden = block(r#"{"after": 1, "within": "1s", "for": "1s", "status": 403}"#);
        assert_eq!(forbidden.unwrap().status, 403);
    }

    #[test]
    fn bad_blocks_name_their_field() {
        for (json, field) in [
            (r#"{"after": 0, "within": "1m", "for": "1m"}"#, "b.after"),
            (r#"{"after": 1, "within": "soon", "for": "1m"}"#, "b.within"),
            (r#"{"after": 1, "within": "1m", "for": "31d"}"#, "b.for"),
            (
                r#"{"after": 1, "within": "1m", "for": "1m", "status": 200}"#,
                "b.status",
            ),
        ] {
            assert_eq!(block(json).unwrap_err().field, field, "{json}");
        }
    }
}
