//! Redis (or Valkey) access: a multiplexed, self-reconnecting connection to one server or
//! to a Redis Cluster, and the token bucket script, run with `EVALSHA` and reloaded when a
//! server answers `NOSCRIPT` (in a cluster, `SCRIPT LOAD` goes to every primary).
//!
//! A batch of checks costs one script call per server, or per hash slot in a cluster
//! (`batch` plans the calls and keeps multi-slot checks all-or-nothing with refunds), so
//! Redis pays a script call's fixed cost once per batch rather than once per check.
//!
//! A script call is never sent twice: it takes tokens, so one whose answer was lost may
//! have run, and sending it again would take them twice. Neither client re-sends a command
//! after an I/O error (see `new` and `cluster`); a call is sent again only after an answer
//! that proves it did not run: `NOSCRIPT` (`redis::Script` loads the script first), and in
//! a cluster no connection to send it on, or a node that does not serve its slot (yet).

use crate::batch::{self, Call, Tally};
use crate::check::{Check, CheckOutcome};
use crate::keyspace::Keyspace;
use crate::metrics::{self, Metrics};
use crate::override_cache::OverrideCache;
use crate::script::{self, Mode, TOKEN_BUCKET_LUA};
use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    ErrorKind, FromRedisValue, RedisError, RedisResult, ScriptInvocation, ServerErrorKind,
};
use std::sync::{Arc, RwLock};
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

#[derive(Clone)]
enum Backend {
    /// Pipelines concurrent commands on one connection and reconnects by itself.
    Single(Box<Single>),
    /// Connected on first use (the bridge starts while the cluster is down); the connection
    /// follows `MOVED`/`ASK` and refreshes the topology after a failover.
    Cluster {
        client: Box<ClusterClient>,
        conn: Arc<OnceCell<ClusterConnection>>,
    },
}

/// One server's connection. The manager reconnects by itself after I/O errors only: once
/// Redis refused its credentials it would keep failing, even after the server accepts them
/// (a password rotation done in the wrong order, then fixed), until the bridge restarts.
/// So a refused login makes the health loop remake it from the client and config.
#[derive(Clone)]
struct Single {
    conn: Arc<RwLock<ConnectionManager>>,
    client: redis::Client,
    config: ConnectionManagerConfig,
}

impl Single {
    fn conn(&self) -> ConnectionManager {
        match self.conn.read() {
            Ok(conn) => conn.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn remake(&self) {
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => match self.conn.write() {
                Ok(mut conn) => *conn = fresh,
                Err(poisoned) => *poisoned.into_inner() = fresh,
            },
            Err(e) => log::warn!("cannot remake the redis connection: {e}"),
        }
    }
}

/// The shared handle to Redis; cheap to clone (connections are multiplexed).
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    script: redis::Script,
    keyspace: Arc<Keyspace>,
    overrides: Arc<OverrideCache>,
    /// What `GET /metrics` shows, recorded by the store and the server alike.
    metrics: Arc<Metrics>,
}

impl Store {
    /// One server. Prepares the connection without dialing: the bridge starts (and reports
    /// unhealthy) even while Redis is down. The manager never re-sends a command: a failed
    /// one only makes it reconnect in the background, and its "retries" are attempts to
    /// connect (two, then the next command tries again; `health` makes sure one does).
    pub fn new(url: &str, options: StoreOptions) -> redis::RedisResult<Store> {
        Store::with_client(redis::Client::open(url)?, options)
    }

    /// One server through `client`, which carries TLS and credentials (see `connect`).
    pub fn with_client(client: redis::Client, options: StoreOptions) -> redis::RedisResult<Store> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Store {
            backend: Backend::Single(Box::new(Single {
                conn: Arc::new(RwLock::new(conn)),
                client,
                config,
            })),
            script: redis::Script::new(TOKEN_BUCKET_LUA),
            keyspace: Arc::default(),
            overrides: Arc::default(),
            metrics: Arc::default(),
        })
    }

    /// A Redis Cluster reached through any of `seeds`. Without the client's retries: it
    /// re-sends a command on an I/O error (a dropped connection, a response timeout) as
    /// readily as on `MOVED`, so a script call that ran could run twice. `on_cluster`
    /// re-sends only what provably did not run.
    pub fn cluster(seeds: &[String], options: StoreOptions) -> redis::RedisResult<Store> {
        Store::with_cluster(ClusterClient::builder(seeds.to_vec()), options)
    }

    /// A Redis Cluster through `builder`, which carries TLS and credentials (see `connect`).
    pub fn with_cluster(
        builder: ClusterClientBuilder,
        options: StoreOptions,
    ) -> redis::RedisResult<Store> {
        let client = builder
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(0)
            .build()?;
        Ok(Store {
            backend: Backend::Cluster {
                client: Box::new(client),
                conn: Arc::new(OnceCell::new()),
            },
            script: redis::Script::new(TOKEN_BUCKET_LUA),
            keyspace: Arc::default(),
            overrides: Arc::default(),
            metrics: Arc::default(),
        })
    }

    /// The same store, touching only keys under `keyspace` (default: `rl:`).
    pub fn with_keyspace(self, keyspace: Keyspace) -> Store {
        Store {
            keyspace: Arc::new(keyspace),
            ..self
        }
    }

    /// The keys this store may touch.
    pub fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    /// The overrides checks are rewritten with (`override_cache` keeps them fresh).
    pub fn overrides(&self) -> &OverrideCache {
        &self.overrides
    }

    /// The bridge's metrics (served on `/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs a batch: one script call for all of it on a single server (a few for a very
    /// large batch), one per hash slot in a cluster, all in parallel. Checks are applied in
    /// order and each stays all-or-nothing; in a cluster, a check spanning slots peeks at
    /// all of them first and takes only if all would admit (refunds cover the races). One
    /// outcome per check, in order.
    pub async fn check_all(&self, checks: &[Check]) -> Vec<CheckOutcome> {
        let clustered = matches!(self.backend, Backend::Cluster { .. });
        let mut calls = batch::plan(checks, clustered);
        let mut tally = Tally::new(checks);
        let spanning = batch::spanning(checks.len(), &calls);
        // A check spanning slots takes no lease: a refund after a race between its slots
        // could not know what a lease took.
        let unleased: Vec<Check>;
        let checks = if spanning.contains(&true) && checks.iter().flatten().any(|r| r.lease > 0) {
            unleased = batch::without_leases(checks, &spanning);
            &unleased[..]
        } else {
            checks
        };
        if spanning.contains(&true) {
            let peeks = batch::only(&calls, |c| spanning.get(c) == Some(&true));
            let replies =
                join_all(peeks.iter().map(|call| self.call(Mode::Peek, checks, call))).await;
            for (call, reply) in peeks.iter().zip(replies) {
                tally.peeked(call, reply);
            }
            calls = batch::only(&calls, |c| !tally.decided(c));
        }
        let replies = join_all(
            calls
                .iter()
                .map(|call| self.call(Mode::Check, checks, call)),
        )
        .await;
        for (call, reply) in calls.iter().zip(replies) {
            tally.checked(call, reply);
        }
        let refunds = tally.refunds();
        if !refunds.is_empty() {
            let calls = batch::group(checks, refunds, clustered);
            let replies = join_all(
                calls
                    .iter()
                    .map(|call| self.call(Mode::Refund, checks, call)),
            )
            .await;
            for (call, reply) in calls.iter().zip(replies) {
                tally.refunded(call, reply);
            }
        }
        tally.finish()
    }

    /// Gives back each refund's cost to every bucket of its rules (the tokens a lease did
    /// not use); one outcome per refund, in order: the buckets after the refund.
    pub async fn refund_all(&self, refunds: &[Check]) -> Vec<CheckOutcome> {
        if refunds.is_empty() {
            return Vec::new();
        }
        let clustered = matches!(self.backend, Backend::Cluster { .. });
        let calls = batch::plan(refunds, clustered);
        let replies = join_all(
            calls
                .iter()
                .map(|call| self.call(Mode::Refund, refunds, call)),
        )
        .await;
        let mut tally = Tally::new(refunds);
        for (call, reply) in calls.iter().zip(replies) {
            tally.checked(call, reply);
        }
        tally.finish()
    }

    /// Runs one check atomically (a batch of one).
    pub async fn check(&self, check: &Check) -> CheckOutcome {
        self.check_all(std::slice::from_ref(check))
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| Err("no outcome for the check".into()))
    }

    /// What `check` (one rule, or rules of one slot in a cluster) would get now, taking
    /// nothing: the script's `peek` mode.
    pub async fn peek(&self, check: &Check) -> CheckOutcome {
        let call = Call {
            parts: vec![script::Part {
                check: 0,
                rules: (0..check.len()).collect(),
            }],
        };
        let (now, rules) = self
            .call(Mode::Peek, std::slice::from_ref(check), &call)
            .await?;
        let rules: Option<Vec<_>> = rules.into_iter().collect();
        Ok((
            now,
            rules.ok_or("a key holds a value the script did not write")?,
        ))
    }

    /// Runs `script` (whose keys share one slot, in a cluster) with `keys` and `args`.
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, String> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        match &self.backend {
            Backend::Single(single) => invocation.invoke_async(&mut single.conn()).await,
            Backend::Cluster { .. } => {
                on_cluster(&invocation, &mut self.cluster_conn().await?).await
            }
        }
        .map_err(|e| format!("redis: {e}"))
    }

    /// Runs one read-only command (whose keys share one slot, in a cluster).
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        match &self.backend {
            Backend::Single(single) => cmd.query_async(&mut single.conn()).await,
            Backend::Cluster { .. } => cmd.query_async(&mut self.cluster_conn().await?).await,
        }
        .map_err(|e| format!("redis: {e}"))
    }

    /// One script call over `call`'s parts of `checks` (one slot in a cluster).
    async fn call(&self, mode: Mode, checks: &[Check], call: &Call) -> batch::Reply {
        let invocation = script::invocation(&self.script, mode, checks, &call.parts)?;
        let started = Instant::now();
        let reply: RedisResult<Vec<i64>> = match &self.backend {
            Backend::Single(single) => invocation.invoke_async(&mut single.conn()).await,
            Backend::Cluster { .. } => {
                on_cluster(&invocation, &mut self.cluster_conn().await?).await
            }
        };
        // For the metrics; a cluster's node (the slot's owner) is not known here.
        let node = match self.backend {
            Backend::Single(_) => "single",
            Backend::Cluster { .. } => "cluster",
        };
        let result = reply.as_ref().map(|_| ()).map_err(metrics::redis_failure);
        let (parts, rules, elapsed) = (call.parts.len(), call.rules(), started.elapsed());
        self.metrics
            .script_call(node, mode.arg(), parts, rules, elapsed, result);
        script::decode(&reply.map_err(|e| format!("redis: {e}"))?, rules)
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
            Backend::Single(single) => match single.conn().req_packed_command(&cmd).await {
                Ok(_) => true,
                Err(e) => {
                    if e.kind() == ErrorKind::AuthenticationFailed {
                        single.remake();
                    }
                    false
                }
            },
            Backend::Cluster { .. } => match self.cluster_conn().await {
                Ok(mut conn) => conn.req_packed_command(&cmd).await.is_ok(),
                Err(_) => false,
            },
        }
    }
}

/// Attempts at a script call on a cluster, when the cluster refused it without running it.
const CLUSTER_ATTEMPTS: u32 = 3;
/// Pause before the next attempt, times the attempts made: time for the client to
/// reconnect or to refresh its slot map, which the refusal set off.
const CLUSTER_PAUSE: Duration = Duration::from_millis(25);

/// Runs `invocation` on the cluster, sending it again only when it provably did not run.
async fn on_cluster<T: FromRedisValue>(
    invocation: &ScriptInvocation<'_>,
    conn: &mut ClusterConnection,
) -> RedisResult<T> {
    let mut attempts = 1;
    loop {
        match invocation.invoke_async(conn).await {
            Err(e) if attempts < CLUSTER_ATTEMPTS && did_not_run(&e) => {
                tokio::time::sleep(CLUSTER_PAUSE * attempts).await;
                attempts += 1;
            }
            reply => return reply,
        }
    }
}

/// Whether the cluster refused a command without running it: no connection to send it on,
/// or a node that does not serve its slot (a redirect, a slot failing over, a node still
/// loading). Never an I/O error: the command may have run. Not `ASK` either: sent again
/// the same way, the call would only meet it again (it needs `ASKING` on the target).
fn did_not_run(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
            )
    )
}
