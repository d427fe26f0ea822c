//! Redis (or Valkey) as the bridge uses it, the `Store`: batches of checks run as token
//! bucket script calls, one per node, merged with every other exchange's calls to that node
//! (`calls::commit`), each check all-or-nothing (`calls::batch` plans the calls,
//! `calls::tally` reads the answers), on a single server, the master Redis Sentinels name,
//! or a Redis Cluster whose slot map the store keeps (`slot_map`, `topology`); how it
//! reaches them is `connection`'s. The store knows checks and keys, never where they came
//! from: that is the engine's and the doors'.
//!
//! Calls a Cluster refused without running them (a slot that moved, is migrating or is
//! failing over) are sent again where their buckets now live, a few times (`send`).
//! Nothing else is ever sent twice (see `connection::backend`).
//!
//! Its modules, bottom to top:
//!
//! - `check`: a check as the store runs it (one request's rules) and its outcome. The
//!   script's calling convention, shared with the filter, is `ratelimit_protocol::script`.
//! - `keyspace`: the keys the bridge may touch: its prefixes, and the keys' grammar.
//! - `slot`: Redis Cluster key slots.
//! - `topology`: a Cluster's slot map: which node serves each slot.
//! - `calls`: a batch of checks into script calls per node (`batch`), every exchange's
//!   calls to a node merged (`commit`), their answers gathered per check (`tally`).
//! - `connection`: the connection to Redis (one server, a Sentinel group's master, a
//!   Cluster), its TLS and credentials, one script call on one node, and the flags that
//!   say where Redis is (`redis_args`).
//! - `slot_map`: the slot map a store plans with, read again when a slot moved.
//! - `send`: a batch's calls sent through their lanes, and again where a Cluster moved them.
//! - `redis_memory`: the warning about a `maxmemory` policy that fails checks or evicts
//!   overrides.
//! - `health`: the background ping that reconnects to a Redis that is back.
//! - `fakes` (tests only): the unit tests' shared rule and two-node slot map.

pub mod calls;
pub mod check;
pub mod connection;
#[cfg(test)]
pub(crate) mod fakes;
pub mod health;
pub mod keyspace;
pub mod redis_memory;
mod send;
pub mod slot;
pub mod slot_map;
pub mod topology;

use crate::ops::metrics::Metrics;
use calls::batch::{self, Placed};
use calls::commit::{Lanes, CALLS_IN_FLIGHT};
use calls::tally::Tally;
use check::{Check, CheckOutcome};
use connection::backend::Backend;
pub use connection::backend::StoreOptions;
use connection::script_call::did_not_run;
use connection::sentinel::Sentinels;
use keyspace::Keyspace;
use ratelimit_protocol::script::{Mode, Part};
use redis::cluster::ClusterClientBuilder;
use redis::FromRedisValue;
use slot_map::SlotMap;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use topology::Topology;

/// Attempts at a call on a cluster, when the cluster refused it without running it.
const CLUSTER_ATTEMPTS: u32 = 3;
/// Pause before the next attempt, times the attempts made: time for a failover or a slot
/// move to complete, and for the store to read the new slot map.
const CLUSTER_PAUSE: Duration = Duration::from_millis(25);

/// The shared handle to Redis; cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// Where every exchange's calls meet, per node and mode.
    lanes: Arc<Lanes<Backend>>,
    /// How long a check may wait in a lane.
    max_wait: Duration,
    /// The slot map the calls are planned with.
    slot_map: SlotMap,
    keyspace: Arc<Keyspace>,
}

impl Store {
    /// One server at `url`; see `with_client`.
    pub fn new(url: &str, options: StoreOptions) -> redis::RedisResult<Store> {
        Store::with_client(redis::Client::open(url)?, options)
    }

    /// One server through `client`, which carries TLS and credentials (see `connect`).
    pub fn with_client(client: redis::Client, options: StoreOptions) -> redis::RedisResult<Store> {
        Ok(Store::over(
            Backend::single(client, options)?,
            Topology::single(),
            options,
        ))
    }

    /// The master `sentinels` name, followed through failovers (the health loop asks them).
    pub fn with_sentinel(sentinels: Sentinels, options: StoreOptions) -> Store {
        Store::over(
            Backend::sentinel(sentinels, options),
            Topology::single(),
            options,
        )
    }

    /// A Redis Cluster reached through any of `seeds`.
    pub fn cluster(seeds: &[String], options: StoreOptions) -> redis::RedisResult<Store> {
        Store::with_cluster(ClusterClientBuilder::new(seeds.to_vec()), options)
    }

    /// A Redis Cluster through `builder`, which carries TLS and credentials.
    pub fn with_cluster(
        builder: ClusterClientBuilder,
        options: StoreOptions,
    ) -> redis::RedisResult<Store> {
        Ok(Store::over(
            Backend::cluster(builder, options)?,
            Topology::unknown(),
            options,
        ))
    }

    fn over(backend: Backend, topology: Topology, options: StoreOptions) -> Store {
        Store {
            lanes: Arc::new(Lanes::new(
                backend.clone(),
                options.response_timeout,
                CALLS_IN_FLIGHT,
            )),
            max_wait: options.response_timeout,
            backend,
            slot_map: SlotMap::new(topology),
            keyspace: Arc::default(),
        }
    }

    /// The same store with `n` script calls in flight per node and mode (default
    /// `CALLS_IN_FLIGHT`); call before the first check.
    pub fn with_calls_in_flight(self, n: usize) -> Store {
        Store {
            lanes: Arc::new(Lanes::new(self.backend.clone(), self.max_wait, n)),
            ..self
        }
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

    /// The bridge's metrics (served on `/metrics`), recorded by the store and the doors
    /// alike.
    pub fn metrics(&self) -> &Metrics {
        self.backend.metrics()
    }

    /// Runs a batch, each check all-or-nothing, in order where checks share a node; one
    /// outcome per check, in order. See `batch` for a check spanning nodes.
    pub async fn check_all(&self, checks: &[Check]) -> Vec<CheckOutcome> {
        if checks.is_empty() {
            return Vec::new();
        }
        let topology = self.slot_map.get(&self.backend).await;
        let plan = batch::plan(checks, &topology);
        let unleased: Vec<Check>;
        let spanning = plan.spanning.contains(&true);
        let checks = if spanning && checks.iter().flatten().any(|r| r.lease > 0) {
            unleased = batch::without_leases(checks, &plan.spanning);
            &unleased[..]
        } else {
            checks
        };
        let mut tally = Tally::new(checks);
        let calls = batch::group(checks, plan.first);
        for (call, replies) in calls
            .iter()
            .zip(self.send(Mode::Check, checks, &topology, &calls).await)
        {
            tally.checked(call, replies);
        }
        let shared: Vec<Placed> = plan
            .shared
            .into_iter()
            .filter(|(_, p)| !tally.decided(p.check))
            .collect();
        if !shared.is_empty() {
            let peek = |(_, p): &&Placed| plan.peek.get(p.check) == Some(&true);
            let peeks = batch::group(checks, shared.iter().filter(peek).cloned().collect());
            for (call, replies) in peeks
                .iter()
                .zip(self.send(Mode::Peek, checks, &topology, &peeks).await)
            {
                tally.peeked(call, replies);
            }
            let takes: Vec<Placed> = shared
                .into_iter()
                .filter(|(_, p)| !tally.decided(p.check))
                .collect();
            let takes = batch::group(checks, takes);
            for (call, replies) in takes
                .iter()
                .zip(self.send(Mode::Check, checks, &topology, &takes).await)
            {
                tally.checked(call, replies);
            }
        }
        let refunds = batch::group(checks, tally.refunds());
        for (call, replies) in refunds
            .iter()
            .zip(self.send(Mode::Refund, checks, &topology, &refunds).await)
        {
            tally.refunded(call, replies);
        }
        tally.finish()
    }

    /// Runs lease returns: each one's cost goes back to every bucket of its rules (the
    /// tokens a lease did not use), node by node, in the script's `refund` mode; one outcome
    /// per lease return, in order: the buckets after it.
    pub async fn return_leases(&self, returns: &[Check]) -> Vec<CheckOutcome> {
        self.each_node(Mode::Refund, returns).await
    }

    /// Applies metered rules' settlements in the script's `settle` mode, each bucket on its
    /// own, once per id however often it comes; one outcome per settlement.
    pub async fn settle_all(&self, settlements: &[Check]) -> Vec<CheckOutcome> {
        self.each_node(Mode::Settle, settlements).await
    }

    /// Runs one check atomically (a batch of one).
    pub async fn check(&self, check: &Check) -> CheckOutcome {
        first(self.check_all(std::slice::from_ref(check)).await)
    }

    /// `check`'s buckets as they stand, debt included, writing nothing: the `read` mode.
    pub async fn read(&self, check: &Check) -> CheckOutcome {
        first(
            self.each_node(Mode::Read, std::slice::from_ref(check))
                .await,
        )
    }

    /// Runs `checks` in `mode`, each node's rules on their own (no check is atomic across
    /// nodes: for giving back, settling and reading it need not be).
    async fn each_node(&self, mode: Mode, checks: &[Check]) -> Vec<CheckOutcome> {
        if checks.is_empty() {
            return Vec::new();
        }
        let topology = self.slot_map.get(&self.backend).await;
        let mut placed = Vec::new();
        for (i, check) in checks.iter().enumerate() {
            let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (r, rule) in check.iter().enumerate() {
                by_node
                    .entry(topology.node_of(&rule.key))
                    .or_default()
                    .push(r);
            }
            if check.is_empty() {
                by_node.insert(0, Vec::new());
            }
            placed.extend(
                by_node
                    .into_iter()
                    .map(|(node, rules)| (node, Part { check: i, rules })),
            );
        }
        let calls = batch::group(checks, placed);
        let mut tally = Tally::new(checks);
        for (call, replies) in calls
            .iter()
            .zip(self.send(mode, checks, &topology, &calls).await)
        {
            tally.checked(call, replies);
        }
        tally.finish()
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
        let mut attempts = 1;
        loop {
            match self.backend.invoke(&invocation).await {
                Err(e) if attempts < CLUSTER_ATTEMPTS && did_not_run(&e) => {
                    tokio::time::sleep(CLUSTER_PAUSE * attempts).await;
                    attempts += 1;
                }
                reply => return reply.map_err(|e| format!("redis: {e}")),
            }
        }
    }

    /// Runs one read-only command (whose keys share one slot, in a cluster).
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let reply = self.backend.query(cmd).await;
        reply.map_err(|e| format!("redis: {e}"))
    }

    /// Whether Redis answers a `PING` now (in a cluster: a node; with sentinels: whether
    /// the master answers as a master).
    pub async fn ping(&self) -> bool {
        self.backend.ping().await
    }

    /// With sentinels: asks them where the master is and moves there if it moved; why no
    /// master answers, if none does. Otherwise nothing to do.
    pub async fn follow(&self) -> Result<(), String> {
        self.backend.follow().await
    }

    /// Waits `pause`, or less when a command meets a failover's trouble (with sentinels).
    pub async fn idle(&self, pause: Duration) {
        self.backend.idle(pause).await
    }

    /// `INFO <section>` (in a cluster: of one primary).
    pub async fn info(&self, section: &str) -> Result<String, String> {
        let reply = self.backend.info(section).await;
        reply.map_err(|e| format!("redis: {e}"))
    }

    /// Reads the slot map again (a cluster only), unless it was read a moment ago; with
    /// sentinels, names the one node after the master now known (see `slot_map`).
    pub async fn read_topology(&self) -> Arc<Topology> {
        self.slot_map.read(&self.backend).await
    }
}

/// The outcome of a batch of one.
fn first(outcomes: Vec<CheckOutcome>) -> CheckOutcome {
    (outcomes.into_iter().next()).unwrap_or_else(|| Err("no outcome".into()))
}
