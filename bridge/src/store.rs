//! Redis (or Valkey) access: a multiplexed, self-reconnecting connection to one server or
//! to a Redis Cluster, and the token bucket script, run with `EVALSHA` and reloaded when a
//! server answers `NOSCRIPT` (in a cluster, `SCRIPT LOAD` goes to every primary).
//!
//! In a cluster a check's rules usually hash to different slots: the bridge runs one script
//! call per slot, all in parallel, and keeps the check all-or-nothing by refunding what the
//! admitting slots took when another slot denied.

use crate::slot::slot;
use crate::wire::{Check, CheckOutcome, RuleOutcome, RuleSpec};
use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

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

#[derive(Clone)]
enum Backend {
    /// Pipelines concurrent commands on one connection and reconnects by itself.
    Single(ConnectionManager),
    /// Connected on first use (the bridge starts while the cluster is down); the connection
    /// follows `MOVED`/`ASK` and refreshes the topology after a failover.
    Cluster {
        client: Box<ClusterClient>,
        conn: Arc<OnceCell<ClusterConnection>>,
    },
}

/// The shared handle to Redis; cheap to clone (connections are multiplexed).
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    script: redis::Script,
}

/// What a script call does to its buckets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Check,
    Refund,
}

impl Store {
    /// One server. Prepares the connection without dialing: the bridge starts (and reports
    /// unhealthy) even while Redis is down.
    pub fn new(url: &str, options: StoreOptions) -> redis::RedisResult<Store> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        Ok(Store {
            backend: Backend::Single(ConnectionManager::new_lazy_with_config(client, config)?),
            script: redis::Script::new(TOKEN_BUCKET_LUA),
        })
    }

    /// A Redis Cluster reached through any of `seeds`.
    pub fn cluster(seeds: &[String], options: StoreOptions) -> redis::RedisResult<Store> {
        let client = ClusterClient::builder(seeds.to_vec())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(2)
            .build()?;
        Ok(Store {
            backend: Backend::Cluster {
                client: Box::new(client),
                conn: Arc::new(OnceCell::new()),
            },
            script: redis::Script::new(TOKEN_BUCKET_LUA),
        })
    }

    /// Runs every check of a batch concurrently.
    pub async fn check_all(&self, checks: &[Check]) -> Vec<CheckOutcome> {
        join_all(checks.iter().map(|c| self.check(c))).await
    }

    /// Runs one check atomically: one script call, or in a cluster one per slot.
    pub async fn check(&self, check: &Check) -> CheckOutcome {
        if matches!(self.backend, Backend::Single(_)) {
            return self.call(Mode::Check, check.iter()).await;
        }
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, rule) in check.iter().enumerate() {
            groups.entry(slot(rule.key.as_bytes())).or_default().push(i);
        }
        let groups: Vec<Vec<usize>> = groups.into_values().collect();
        let replies = join_all(
            groups
                .iter()
                .map(|g| self.call(Mode::Check, g.iter().map(|&i| &check[i]))),
        )
        .await;
        let mut now = 0;
        let mut results: Vec<Option<RuleOutcome>> = vec![None; check.len()];
        let mut failure = None;
        let mut admitted_groups = Vec::new();
        for (group, reply) in groups.iter().zip(replies) {
            match reply {
                Ok((t, outcomes)) => {
                    now = now.max(t);
                    if outcomes.iter().all(|o| o.allowed) {
                        admitted_groups.push(group);
                    }
                    for (&i, o) in group.iter().zip(outcomes) {
                        results[i] = Some(o);
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        if admitted_groups.len() < groups.len() {
            // Someone denied (or failed): give back what the admitting slots took.
            for group in admitted_groups {
                match self
                    .call(Mode::Refund, group.iter().map(|&i| &check[i]))
                    .await
                {
                    Ok((_, refunded)) => group
                        .iter()
                        .zip(refunded)
                        .for_each(|(&i, o)| results[i] = Some(o)),
                    Err(e) => log::warn!("refund failed, tokens lost until refill: {e}"),
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let results: Option<Vec<RuleOutcome>> = results.into_iter().collect();
        Ok((now, results.ok_or("a slot gave no result")?))
    }

    /// One script call over `rules`, which must share a slot in a cluster.
    async fn call<'a>(
        &self,
        mode: Mode,
        rules: impl Iterator<Item = &'a RuleSpec>,
    ) -> CheckOutcome {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(if mode == Mode::Refund {
            "refund"
        } else {
            "check"
        });
        let mut count = 0;
        for rule in rules {
            invocation
                .key(&rule.key)
                .arg(rule.burst)
                .arg(rule.num)
                .arg(rule.den)
                .arg(rule.cost);
            count += 1;
        }
        let reply: Vec<i64> = match &self.backend {
            Backend::Single(conn) => invocation.invoke_async(&mut conn.clone()).await,
            Backend::Cluster { .. } => {
                invocation
                    .invoke_async(&mut self.cluster_conn().await?)
                    .await
            }
        }
        .map_err(|e| format!("redis: {e}"))?;
        decode_script_reply(&reply, count)
    }

    async fn cluster_conn(&self) -> Result<ClusterConnection, String> {
        let Backend::Cluster { client, conn } = &self.backend else {
            return Err("not a cluster".into());
        };
        conn.get_or_try_init(|| client.get_async_connection())
            .await
            .cloned()
            .map_err(|e| format!("redis cluster: {e}"))
    }

    /// Whether Redis answers a `PING` now (in a cluster: every primary).
    pub async fn ping(&self) -> bool {
        let cmd = redis::cmd("PING");
        match &self.backend {
            Backend::Single(conn) => conn.clone().req_packed_command(&cmd).await.is_ok(),
            Backend::Cluster { .. } => match self.cluster_conn().await {
                Ok(mut conn) => conn.req_packed_command(&cmd).await.is_ok(),
                Err(_) => false,
            },
        }
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
