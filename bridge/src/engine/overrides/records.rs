//! Where an override lives in Redis and how it is written there: a record per target under
//! its prefix, `{overrides}` after the prefix where no bucket key can reach, and the index
//! that lists a prefix's records; a record's value, `<requests> <per_ms> <burst>` and the
//! expiry the script appends from Redis's clock.

use super::{Override, Target};
use crate::store::keyspace::is_name;
use ratelimit_config::limit::Limit;

/// The segment after `<prefix>:` that every override record starts with. Bucket keys are
/// `<prefix>:<rule>[:<value>...]` (`ratelimit_protocol::key`), where a rule name holds only
/// `[A-Za-z0-9._-]` and a value only `[A-Za-z0-9._@+=!~%-]` (or `#` and hex digits), so no
/// bucket key can have a `{` after its prefix: no record can ever be read or overwritten as
/// a bucket, and no caller of the bridge can name one (`keyspace` refuses such checks).
/// The braces are also a Redis Cluster hash tag: every record of every prefix hashes to
/// one slot, so a record and the index are written together by one script call and listed
/// with one `ZRANGE` and one `MGET`, on a Cluster too.
const NAMESPACE: &str = "{overrides}";

/// The sorted set that lists a prefix's overrides: member = target (`rule` or
/// `rule:value...`), score = the Redis time (ms) its record expires.
pub fn index_key(prefix: &str) -> String {
    format!("{prefix}:{NAMESPACE}")
}

/// The record of `target` under `prefix`: a string expiring (Redis `PX`) with the override.
pub fn record_key(prefix: &str, target: &str) -> String {
    format!("{prefix}:{NAMESPACE}:{target}")
}

/// A record's value without its expiry, which the script appends from Redis's clock:
/// `<requests> <per_ms> <burst>`.
pub fn encode(limit: &Limit) -> String {
    format!("{} {} {}", limit.requests, limit.per_ms, limit.burst)
}

/// Reads the record of `member` under `prefix`: `<requests> <per_ms> <burst> <expires_ms>`.
pub fn decode(prefix: &str, member: &str, value: &str) -> Result<Override, String> {
    let bad = || {
        format!(
            "override record {:?}: {value:?}",
            record_key(prefix, member)
        )
    };
    let numbers: Vec<u64> = value
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let [requests, per_ms, burst, expires_ms] = numbers[..] else {
        return Err(bad());
    };
    let limit = Limit::new(requests, per_ms, Some(burst), 1).map_err(|_| bad())?;
    let rule = member.split(':').next().unwrap_or_default();
    if !is_name(rule) {
        return Err(bad());
    }
    Ok(Override {
        target: Target {
            prefix: prefix.into(),
            rule: rule.into(),
            key: format!("{prefix}:{member}"),
        },
        limit,
        expires_ms,
    })
}
