//! Group commit across every gateway: the checks of all exchanges, from every connection
//! and stream, queue per Redis node, and while a node has its calls in flight whatever
//! arrives meanwhile joins the next call. No timer: a call leaves as soon as a slot for it
//! is free, so an idle bridge sends one check per call and a busy one dozens, and Redis
//! pays a script call's fixed cost (most of its work for a small call) once per call
//! rather than once per check. At fleet scale a gateway worker's exchange usually holds
//! a single check, so the coalescing has to happen here, where every gateway's checks meet.
//!
//! A call holds *parts*: rules of one check that live on one node, each all-or-nothing
//! (the script's contract), in the order they arrived; each part's answer goes back to its
//! own exchange. One lane per node and mode (take, give back, peek), so a slow or failed
//! node holds up and fails only its own checks.

use crate::store::check::{Check, RuleSpec};
use hashbrown::HashSet;
use ratelimit_protocol::script::{self, Mode, ScriptOutcome, Shape, MAX_PART_RULES, MAX_SHAPES};
pub use ratelimit_protocol::script::{MAX_KEYS_PER_CALL, MAX_PARTS_PER_CALL};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Calls of one lane in flight at once, by default (`--calls-in-flight`). One makes the
/// largest calls: everything that arrives during a round trip leaves in the next call.
/// Two hide the round trip of a distant Redis (the node works on one while the other
/// travels) at the price of calls half as large.
pub const CALLS_IN_FLIGHT: usize = 1;
/// Parts waiting in one lane, past which new ones fail at once rather than queue: a node
/// this far behind would answer them after the gateways stopped waiting.
pub const MAX_QUEUED_PARTS: usize = 64 * 1024;

/// Why a call gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// It failed, and may have run: never sent again (it would take tokens twice).
    Failed(String),
    /// The node refused it without running it (a slot it does not serve, a failover or
    /// a slot migration under way): it may be sent again, where the slot now lives.
    NotRun(String),
    /// The node does not hold a key of it (its slot moved, or is migrating with the key
    /// already on the target), so it did not run: it may be sent where the node redirects
    /// that key.
    Misplaced(String),
}

impl CallError {
    pub fn reason(&self) -> &str {
        match self {
            CallError::Failed(reason)
            | CallError::NotRun(reason)
            | CallError::Misplaced(reason) => reason,
        }
    }
}

/// What one part of a call came to: the Redis time and its rules' outcomes in order.
pub type PartReply = Result<(u64, Vec<ScriptOutcome>), CallError>;

/// Runs one script call on a node: the store, below this module.
pub trait Caller: Clone + Send + Sync + 'static {
    /// One call in `mode` over `parts` (each the rules of one part, in order), `queued`
    /// parts still waiting behind it; one reply per part.
    fn call(
        &self,
        node: &Arc<str>,
        mode: Mode,
        parts: Vec<Check>,
        queued: usize,
    ) -> impl Future<Output = Vec<PartReply>> + Send;
}

/// What bounds one call: keys, parts and distinct shapes (see the script's layout).
#[derive(Default)]
pub struct Fill {
    keys: usize,
    parts: usize,
    shapes: HashSet<Shape>,
    /// A part over the script's limits is alone in its call, to fail alone.
    oversized: bool,
}

impl Fill {
    /// Whether `parts` (each an iterator over its rules) may join the call together; an
    /// empty call takes anything.
    pub fn fits<'r, P>(&self, parts: impl IntoIterator<Item = P>) -> bool
    where
        P: IntoIterator<Item = &'r RuleSpec>,
    {
        if self.parts == 0 {
            return true;
        }
        let (mut keys, mut count) = (0, 0);
        let mut new = HashSet::new();
        for part in parts {
            count += 1;
            let mut n = 0;
            for rule in part {
                n += 1;
                let shape = script::shape(rule);
                if !self.shapes.contains(&shape) {
                    new.insert(shape);
                }
            }
            if n > MAX_PART_RULES {
                return false;
            }
            keys += n;
        }
        !self.oversized
            && self.keys + keys <= MAX_KEYS_PER_CALL
            && self.parts + count <= MAX_PARTS_PER_CALL
            && self.shapes.len() + new.len() <= MAX_SHAPES
    }

    /// Counts `parts` in.
    pub fn add<'r, P>(&mut self, parts: impl IntoIterator<Item = P>)
    where
        P: IntoIterator<Item = &'r RuleSpec>,
    {
        for part in parts {
            let mut n = 0;
            for rule in part {
                self.shapes.insert(script::shape(rule));
                n += 1;
            }
            self.oversized |= n > MAX_PART_RULES;
            self.keys += n;
            self.parts += 1;
        }
    }
}

/// Parts of one exchange for one lane, and where their replies go.
struct Job {
    parts: Vec<Check>,
    reply: oneshot::Sender<Vec<PartReply>>,
    queued: Instant,
}

/// One node's queue for one mode.
#[derive(Clone)]
struct Lane {
    queue: mpsc::UnboundedSender<Job>,
    /// Parts queued and not yet taken into a call.
    depth: Arc<AtomicUsize>,
}

/// Every lane, made on first use.
pub struct Lanes<C> {
    /// Shared by every lane's calls (a clone per call must cost no more than a count).
    caller: Arc<C>,
    /// Calls of one lane in flight at once (at least 1).
    in_flight: usize,
    /// How long a part may wait in its queue; past it, it fails without being sent.
    max_wait: Duration,
    lanes: Mutex<HashMap<(Arc<str>, Mode), Lane>>,
}

impl<C: Caller> Lanes<C> {
    pub fn new(caller: C, max_wait: Duration, in_flight: usize) -> Lanes<C> {
        Lanes {
            caller: Arc::new(caller),
            in_flight: in_flight.max(1),
            max_wait,
            lanes: Mutex::default(),
        }
    }

    /// Parts waiting for `node` in every mode (the metrics get it per call: see `Caller`).
    #[cfg(test)]
    pub fn depth(&self, node: &str) -> usize {
        let lanes = match self.lanes.lock() {
            Ok(lanes) => lanes,
            Err(poisoned) => poisoned.into_inner(),
        };
        lanes
            .iter()
            .filter(|((n, _), _)| &**n == node)
            .map(|(_, lane)| lane.depth.load(Ordering::Relaxed))
            .sum()
    }

    /// Queues `parts` for `node` in `mode` (within one call's bounds: see `Fill`) and
    /// waits for their replies, one per part.
    pub async fn submit(&self, node: &Arc<str>, mode: Mode, parts: Vec<Check>) -> Vec<PartReply> {
        let n = parts.len();
        let lane = self.lane(node, mode);
        if lane.depth.fetch_add(n, Ordering::Relaxed) > MAX_QUEUED_PARTS {
            lane.depth.fetch_sub(n, Ordering::Relaxed);
            return failed(
                n,
                format!("redis node {node} is {MAX_QUEUED_PARTS} checks behind"),
            );
        }
        let (reply, replied) = oneshot::channel();
        let job = Job {
            parts,
            reply,
            queued: Instant::now(),
        };
        if lane.queue.send(job).is_err() {
            lane.depth.fetch_sub(n, Ordering::Relaxed);
            return failed(n, "the bridge is shutting down".into());
        }
        replied
            .await
            .unwrap_or_else(|_| failed(n, "the call was dropped".into()))
    }

    fn lane(&self, node: &Arc<str>, mode: Mode) -> Lane {
        let mut lanes = match self.lanes.lock() {
            Ok(lanes) => lanes,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(lane) = lanes.get(&(node.clone(), mode)) {
            return lane.clone();
        }
        let (queue, jobs) = mpsc::unbounded_channel();
        let lane = Lane {
            queue,
            depth: Arc::default(),
        };
        tokio::spawn(drive(
            self.caller.clone(),
            node.clone(),
            mode,
            jobs,
            lane.depth.clone(),
            self.max_wait,
            self.in_flight,
        ));
        lanes.insert((node.clone(), mode), lane.clone());
        lane
    }
}

fn failed(parts: usize, reason: String) -> Vec<PartReply> {
    vec![Err(CallError::Failed(reason)); parts]
}

/// A lane's loop: waits for a free call slot, then for work, takes every job that fits
/// one call, and sends it.
async fn drive<C: Caller>(
    caller: Arc<C>,
    node: Arc<str>,
    mode: Mode,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    depth: Arc<AtomicUsize>,
    max_wait: Duration,
    in_flight: usize,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut next: Option<Job> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match next.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut fill = Fill::default();
        let mut call = Vec::new();
        let mut job = Some(first);
        while let Some(j) = job.take() {
            if !fill.fits(&j.parts) {
                next = Some(j);
                break;
            }
            depth.fetch_sub(j.parts.len(), Ordering::Relaxed);
            if j.queued.elapsed() > max_wait {
                let reason = format!("waited over {max_wait:?} for redis node {node}");
                let _ = j.reply.send(failed(j.parts.len(), reason));
            } else {
                fill.add(&j.parts);
                call.push(j);
            }
            job = jobs.try_recv().ok();
        }
        if call.is_empty() {
            continue;
        }
        let (caller, node) = (caller.clone(), node.clone());
        let queued = depth.load(Ordering::Relaxed);
        tokio::spawn(async move {
            let _slot = slot;
            commit(&*caller, &node, mode, call, queued).await;
        });
    }
}

/// Sends the jobs' parts as one call and hands each job its parts' replies.
async fn commit<C: Caller>(caller: &C, node: &Arc<str>, mode: Mode, jobs: Vec<Job>, queued: usize) {
    let mut parts = Vec::with_capacity(jobs.iter().map(|j| j.parts.len()).sum());
    let mut waiting = Vec::with_capacity(jobs.len());
    for job in jobs {
        waiting.push((job.parts.len(), job.reply));
        parts.extend(job.parts);
    }
    let total = parts.len();
    let mut replies = caller.call(node, mode, parts, queued).await.into_iter();
    for (n, reply) in waiting {
        let mut mine: Vec<PartReply> = replies.by_ref().take(n).collect();
        if mine.len() < n {
            let reason = format!("the call answered fewer than its {total} parts");
            mine.resize(n, Err(CallError::Failed(reason)));
        }
        let _ = reply.send(mine);
    }
}

#[cfg(test)]
#[path = "commit_tests.rs"]
mod tests;
