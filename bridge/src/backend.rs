//! The connection to Redis (or Valkey): one multiplexed, self-reconnecting connection to a
//! single server or to the master that Redis Sentinels name (`single`), or one to a Redis
//! Cluster; and one script call on one node, which is what the store's lanes (`commit`)
//! send.
//!
//! A script call is never sent twice: it takes tokens, so one whose answer was lost may
//! have run, and sending it again would take them twice. Neither client re-sends a command
//! after an I/O error (see `Backend::single` and `Backend::cluster`); a call is sent again
//! only after an answer that proves it did not run: `NOSCRIPT` (`redis::Script` loads the
//! script first), `READONLY` (a master turned replica refuses the script's first write),
//! no master known (with sentinels), and in a cluster no connection to send it on, or a
//! node that does not serve a key's slot (yet): the store sends those again where the slot
//! now lives.

use crate::check::Check;
use crate::commit::{CallError, Caller, PartReply};
use crate::metrics::{self, Metrics};
use crate::sentinel::Sentinels;
use crate::single::Single;
use crate::topology::Topology;
use futures_util::future::join_all;
use ratelimit_protocol::script::{self, Mode, Part, TOKEN_BUCKET_LUA};
use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::ServerErrorKind;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ScriptInvocation};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// How patiently the bridge talks to Redis.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Bound on establishing a connection; past it the check fails and reconnects later.
    pub connect_timeout: Duration,
    /// Bound on one command; the filter's own timeout is usually shorter.
    pub response_timeout: Duration,
}

/// Redis, and the token bucket script; cheap to clone (connections are multiplexed).
#[derive(Clone)]
pub struct Backend {
    conn: Conn,
    script: Arc<redis::Script>,
    /// Every script call is counted here, per node.
    metrics: Arc<Metrics>,
}

#[derive(Clone)]
enum Conn {
    /// Pipelines concurrent commands on one connection and reconnects by itself; with
    /// sentinels, moves to the master they name.
    Single(Arc<Single>),
    /// Connected on first use (the bridge starts while the cluster is down); the connection
    /// refreshes its topology after a `MOVED` or a failover.
    Cluster {
        client: Arc<ClusterClient>,
        conn: Arc<OnceCell<ClusterConnection>>,
    },
}

impl Backend {
    /// One server through `client`, which carries TLS and credentials (see `connect`).
    /// Prepares the connection without dialing: the bridge starts (and reports unhealthy)
    /// even while Redis is down.
    pub fn single(client: redis::Client, options: StoreOptions) -> RedisResult<Backend> {
        let single = Single::new(client, manager_config(options))?;
        Ok(Backend::with(Conn::Single(Arc::new(single))))
    }

    /// The master `sentinels` name, on the same connection as a single server's, found on
    /// first use and followed through failovers (`follow`).
    pub fn sentinel(sentinels: Sentinels, options: StoreOptions) -> Backend {
        let single = Single::following(sentinels, manager_config(options));
        Backend::with(Conn::Single(Arc::new(single)))
    }

    /// A Redis Cluster through `builder`, which carries TLS and credentials. Without the
    /// client's retries: it re-sends a command on an I/O error (a dropped connection, a
    /// response timeout) as readily as on `MOVED`, so a script call that ran could run
    /// twice.
    pub fn cluster(builder: ClusterClientBuilder, options: StoreOptions) -> RedisResult<Backend> {
        let client = builder
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(0)
            .build()?;
        Ok(Backend::with(Conn::Cluster {
            client: Arc::new(client),
            conn: Arc::new(OnceCell::new()),
        }))
    }

    fn with(conn: Conn) -> Backend {
        Backend {
            conn,
            script: Arc::new(redis::Script::new(TOKEN_BUCKET_LUA)),
            metrics: Arc::default(),
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster { .. })
    }

    /// Runs `invocation` (whose keys share one slot, in a cluster).
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match &self.conn {
            Conn::Single(single) => {
                let reply = invocation.invoke_async(&mut single.conn().await?).await;
                if let Err(e) = &reply {
                    single.trouble(e);
                }
                reply
            }
            Conn::Cluster { .. } => {
                invocation
                    .invoke_async(&mut self.cluster_conn().await?)
                    .await
            }
        }
    }

    /// Runs one command (whose keys share one slot, in a cluster).
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match &self.conn {
            Conn::Single(single) => {
                let reply = cmd.query_async(&mut single.conn().await?).await;
                if let Err(e) = &reply {
                    single.trouble(e);
                }
                reply
            }
            Conn::Cluster { .. } => cmd.query_async(&mut self.cluster_conn().await?).await,
        }
    }

    /// Which node serves which slot now (one node on a single server).
    pub async fn topology(&self) -> Result<Topology, String> {
        if !self.is_cluster() {
            return Ok(Topology::single());
        }
        let mut conn = self
            .cluster_conn()
            .await
            .map_err(|e| format!("redis cluster: {e}"))?;
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        let reply = conn
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), routing)
            .await
            .map_err(|e| format!("redis cluster: CLUSTER SLOTS: {e}"))?;
        Topology::from_cluster_slots(&reply)
    }

    async fn cluster_conn(&self) -> RedisResult<ClusterConnection> {
        let Conn::Cluster { client, conn } = &self.conn else {
            return Err((ErrorKind::Client, "not a cluster").into());
        };
        conn.get_or_try_init(|| client.get_async_connection())
            .await
            .cloned()
    }

    /// Whether Redis answers a `PING` now (in a cluster: a node; with sentinels: whether
    /// the master answers `ROLE` as a master).
    pub async fn ping(&self) -> bool {
        match &self.conn {
            Conn::Single(single) => single.ping().await,
            Conn::Cluster { .. } => match self.cluster_conn().await {
                Ok(mut conn) => conn.req_packed_command(&redis::cmd("PING")).await.is_ok(),
                Err(_) => false,
            },
        }
    }

    /// With sentinels: the connection moved to the master they name now, or why no master
    /// answers (see `Single::follow`). Otherwise nothing to do.
    pub async fn follow(&self) -> Result<(), String> {
        match &self.conn {
            Conn::Single(single) => single.follow().await,
            Conn::Cluster { .. } => Ok(()),
        }
    }

    /// With sentinels: the master's `host:port`, once known.
    pub fn master(&self) -> Option<Arc<str>> {
        match &self.conn {
            Conn::Single(single) => single.master(),
            Conn::Cluster { .. } => None,
        }
    }

    /// Waits `pause`, or less when a command meets a failover's trouble (with sentinels).
    pub async fn idle(&self, pause: Duration) {
        match &self.conn {
            Conn::Single(single) => single.idle(pause).await,
            Conn::Cluster { .. } => tokio::time::sleep(pause).await,
        }
    }

    /// `INFO <section>` of the server; in a cluster, of one primary (the cluster client
    /// would ask every node and merge their answers).
    pub async fn info(&self, section: &str) -> RedisResult<String> {
        let cmd = redis::cmd("INFO").arg(section).clone();
        match &self.conn {
            Conn::Single(single) => cmd.query_async(&mut single.conn().await?).await,
            Conn::Cluster { .. } => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                let mut conn = self.cluster_conn().await?;
                Ok(String::from_redis_value(
                    conn.route_command(cmd, routing).await?,
                )?)
            }
        }
    }
}

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
        self.metrics.queue_depth(node, queued as i64);
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
        let result = reply.as_ref().map(|_| ()).map_err(metrics::redis_failure);
        let (checks, keys) = (rules.len(), layout.keys.len());
        let elapsed = started.elapsed();
        self.metrics
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

/// The connection manager's settings. It never re-sends a command: a failed one only makes
/// it reconnect in the background, and its "retries" are attempts to connect (two, then the
/// next command tries again; `health` makes sure one does).
fn manager_config(options: StoreOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
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
