//! One token bucket script call on one node, which is what the store's lanes
//! (`calls::commit`) send, and what a failed one means.
//!
//! A script call is never sent twice: it takes tokens, so one whose answer was lost may
//! have run, and sending it again would take them twice. A call is sent again only after
//! an answer that proves it did not run: `NOSCRIPT` (`redis::Script` loads the script
//! first), `READONLY` (a master turned replica refuses the script's first write), no
//! master known (with sentinels), and in a cluster no connection to send it on, or a node
//! that does not serve a key's slot (yet): the store sends those again where the slot now
//! lives (`store::send`).

use super::backend::Backend;
use crate::ops::labels;
use crate::store::calls::commit::{CallError, Caller, PartReply};
use crate::store::check::Check;
use futures_util::future::join_all;
use ratelimit_protocol::script::{self, Mode, Part, TOKEN_BUCKET_LUA};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

impl Caller for Backend {
    /// One script call over `parts`. In a cluster the keys may lie in several slots of the
    /// node: they travel as arguments, the first one declared to route the call.
    async fn call(
        &self,
        node: &Arc<str>,
        mode: Mode,
        parts: Vec<Check>,
        queued: usize,
    ) -> Vec<PartReply> {
        self.metrics().queue_depth(node, queued as i64);
        self.call_on(node, None, mode, parts).await
    }
}

impl Backend {
    /// One script call over `parts` on the cluster node at `address` (`host:port`), sent
    /// after `ASKING`: its buckets are in a slot being migrated there (`ASK`), which the
    /// node serves only to a command so marked. Not through a lane: only a resharding
    /// sends these.
    pub async fn call_asking(
        &self,
        address: &Arc<str>,
        mode: Mode,
        parts: Vec<Check>,
    ) -> Vec<PartReply> {
        self.call_on(address, Some(address), mode, parts).await
    }

    /// Where each of `keys` lives according to the cluster node at `node` (`host:port`)
    /// when a call there met a key it does not serve: the keys it redirects (`ASK` during
    /// a slot's migration, `MOVED` once the slot moved), to the node named. A key it
    /// serves, or one it could not be asked about, is left out.
    pub async fn redirects(&self, node: &str, keys: &[&str]) -> HashMap<String, Arc<str>> {
        let (Some(route), Ok(conn)) = (by_address(node), self.cluster_conn().await) else {
            return HashMap::new();
        };
        let asked = keys.iter().map(|&key| {
            let (mut conn, route) = (conn.clone(), route.clone());
            let cmd = redis::cmd("EXISTS").arg(key).clone();
            async move {
                let reply = conn
                    .route_command(cmd, RoutingInfo::SingleNode(route))
                    .await;
                let to = reply
                    .err()?
                    .redirect_node()
                    .map(|(to, _slot)| Arc::from(to))?;
                Some((key.to_string(), to))
            }
        });
        join_all(asked).await.into_iter().flatten().collect()
    }

    /// One script call over `parts` through the cluster client (`asking`: `None`) or on
    /// the node at `asking` after `ASKING`; one reply per part.
    async fn call_on(
        &self,
        node: &Arc<str>,
        asking: Option<&str>,
        mode: Mode,
        parts: Vec<Check>,
    ) -> Vec<PartReply> {
        let rules: Vec<usize> = parts.iter().map(Vec::len).collect();
        let wholes: Vec<Part> = rules
            .iter()
            .enumerate()
            .map(|(i, &n)| Part::whole(i, n))
            .collect();
        let fail = |e: CallError| vec![Err(e); rules.len()];
        let layout = match script::layout(&parts, &wholes) {
            Ok(layout) => layout,
            Err(e) => return fail(CallError::Failed(e)),
        };
        let started = Instant::now();
        let reply: RedisResult<Vec<u8>> = match asking {
            Some(address) => self.eval_asking(address, &layout, mode).await,
            None => {
                let mut invocation = self.script.prepare_invoke();
                if self.is_cluster() {
                    if let Some(first) = layout.keys.first() {
                        invocation.key(*first);
                    }
                    for arg in layout.spread_args(mode) {
                        invocation.arg(arg);
                    }
                } else {
                    for key in &layout.keys {
                        invocation.key(*key);
                    }
                    for arg in layout.args(mode) {
                        invocation.arg(arg);
                    }
                }
                self.invoke(&invocation).await
            }
        };
        let result = reply.as_ref().map(|_| ()).map_err(labels::redis_failure);
        let (checks, keys) = (rules.len(), layout.keys.len());
        let elapsed = started.elapsed();
        self.metrics()
            .script_call(node, mode.arg(), checks, keys, elapsed, result);
        let packed = match reply {
            Ok(packed) => packed,
            Err(e) if misplaced(&e) => return fail(CallError::Misplaced(format!("redis: {e}"))),
            Err(e) if did_not_run(&e) => return fail(CallError::NotRun(format!("redis: {e}"))),
            Err(e) => return fail(CallError::Failed(format!("redis: {e}"))),
        };
        let decoded =
            script::integers(&packed).and_then(|v| script::decode(mode, &v, rules.iter().sum()));
        let (now, outcomes) = match decoded {
            Ok(decoded) => decoded,
            Err(e) => return fail(CallError::Failed(e)),
        };
        let mut outcomes = outcomes.into_iter();
        rules
            .iter()
            .map(|&n| Ok((now, outcomes.by_ref().take(n).collect())))
            .collect()
    }

    /// `ASKING` then the script (`EVAL`, its text: a node a slot is migrating to may not
    /// have loaded it yet, and this path is rare) on the cluster node at `address`, with
    /// the keys as arguments as on any cluster call.
    async fn eval_asking(
        &self,
        address: &str,
        layout: &script::Layout<'_>,
        mode: Mode,
    ) -> RedisResult<Vec<u8>> {
        let route = by_address(address).ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "not host:port", address.into()))
        })?;
        let mut eval = redis::cmd("EVAL");
        eval.arg(TOKEN_BUCKET_LUA)
            .arg(1)
            .arg(layout.keys.first().copied().unwrap_or_default());
        for arg in layout.spread_args(mode) {
            eval.arg(arg);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(eval);
        let mut conn = self.cluster_conn().await?;
        let reply = conn.route_pipeline(pipe, 1, 1, route).await?;
        match reply.into_iter().next() {
            Some(redis::Value::ServerError(e)) => Err(e.into()),
            Some(value) => Ok(Vec::<u8>::from_redis_value(value)?),
            None => Err((ErrorKind::Client, "no reply to the script after ASKING").into()),
        }
    }
}

/// The route to the cluster node at `address` (`host:port`).
fn by_address(address: &str) -> Option<SingleNodeRoutingInfo> {
    let (host, port) = address.rsplit_once(':')?;
    Some(SingleNodeRoutingInfo::ByAddress {
        host: host.to_string(),
        port: port.parse().ok()?,
    })
}

/// Whether Redis refused a command without running it: no connection to send it on (no
/// master known, with sentinels), a replica refusing a write (`READONLY`: the script
/// stops at its first write, having written nothing), or a node that does not serve a
/// key's slot (a redirect, a slot failing over or migrating, a node still loading). Never
/// an I/O error: the command may have run.
pub fn did_not_run(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
            )
    ) || is_non_local(e)
}

/// Whether a cluster node refused a command for a key it does not hold: the key's slot
/// moved (`MOVED`), or is migrating and the key is already on the target (`ASK`; a script
/// meeting such a key among its undeclared ones fails with "non local key").
fn misplaced(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) || is_non_local(e)
}

fn is_non_local(e: &RedisError) -> bool {
    e.to_string().contains("non local key")
}
