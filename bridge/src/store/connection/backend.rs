//! The connection to Redis (or Valkey): one multiplexed, self-reconnecting connection to a
//! single server or to the master that Redis Sentinels name (`single`), or one to a Redis
//! Cluster; and the commands the store sends on it, but the script calls of checks
//! (`script_call`). Neither client re-sends a command after an I/O error (see
//! `Backend::single` and `Backend::cluster`): a command may have run.

use super::sentinel::Sentinels;
use super::single::Single;
use crate::ops::metrics::Metrics;
use crate::store::topology::Topology;
use ratelimit_protocol::script::TOKEN_BUCKET_LUA;
use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, FromRedisValue, RedisResult, ScriptInvocation};
use std::sync::Arc;
use std::time::Duration;
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
    /// The token bucket script (`script_call`).
    pub(super) script: Arc<redis::Script>,
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

    pub(super) async fn cluster_conn(&self) -> RedisResult<ClusterConnection> {
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
