//! Redis (or Valkey) access: one multiplexed, self-reconnecting connection and the token
//! bucket script, run with `EVALSHA` and reloaded when the server answers `NOSCRIPT`.

use crate::wire::{Check, CheckOutcome, RuleOutcome};
use futures_util::future::join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// The token bucket script, the single source of truth for the algorithm.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../lua/token_bucket.lua");

/// How patiently the bridge talks to Redis.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Bound on establishing a connection; past it the check fails and reconnects later.
    pub connect_timeout: Duration,
    /// Bound on one command; the filter's own timeout is usually shorter.
    pub response_timeout: Duration,
}

/// The shared handle to Redis; cheap to clone (the connection is multiplexed).
#[derive(Clone)]
pub struct Store {
    /// Pipelines concurrent commands on one connection and reconnects by itself.
    conn: ConnectionManager,
    script: redis::Script,
}

impl Store {
    /// Prepares the connection without dialing: the bridge starts (and reports unhealthy)
    /// even while Redis is down.
    pub fn new(url: &str, options: StoreOptions) -> redis::RedisResult<Store> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        Ok(Store {
            conn: ConnectionManager::new_lazy_with_config(client, config)?,
            script: redis::Script::new(TOKEN_BUCKET_LUA),
        })
    }

    /// Runs every check of a batch concurrently; each is one script call, one round trip.
    pub async fn check_all(&self, checks: &[Check]) -> Vec<CheckOutcome> {
        join_all(checks.iter().map(|c| self.check(c))).await
    }

    /// Runs one check atomically.
    pub async fn check(&self, check: &Check) -> CheckOutcome {
        let mut invocation = self.script.prepare_invoke();
        for rule in check {
            invocation
                .key(&rule.key)
                .arg(rule.burst)
                .arg(rule.num)
                .arg(rule.den)
                .arg(rule.cost);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("redis: {e}"))?;
        decode_script_reply(&reply, check.len())
    }

    /// Whether Redis answers a `PING` now.
    pub async fn ping(&self) -> bool {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok()
    }
}

/// Checks the script's reply shape: `now`, then four integers per rule.
fn decode_script_reply(reply: &[i64], rules: usize) -> CheckOutcome {
    let (Some(&now), Some(rest)) = (reply.first(), reply.get(1..)) else {
        return Err("empty script reply".into());
    };
    if rest.len() != 4 * rules {
        return Err(format!(
            "script answered {} values for {rules} rules",
            rest.len()
        ));
    }
    let unsigned = |v: i64| u64::try_from(v).map_err(|_| format!("negative value {v} from script"));
    let outcomes = rest
        .chunks_exact(4)
        .map(|r| {
            Ok(RuleOutcome {
                allowed: r[0] == 1,
                remaining: unsigned(r[1])?,
                full_ms: unsigned(r[2])?,
                wait_ms: unsigned(r[3])?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((unsigned(now)?, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replies_of_the_wrong_shape_are_errors() {
        assert!(decode_script_reply(&[], 0).is_err());
        assert!(decode_script_reply(&[1, 1, 2, 3], 1).is_err());
        assert!(decode_script_reply(&[1, 1, -2, 3, 4], 1).is_err());
        let (now, rules) = decode_script_reply(&[5, 0, 1, 2, 3], 1).unwrap();
        assert_eq!(now, 5);
        assert_eq!(
            rules[0],
            RuleOutcome {
                allowed: false,
                remaining: 1,
                full_ms: 2,
                wait_ms: 3
            }
        );
    }
}
