//! The connection slots: at most `--max-connections` at once, and a gateway always gets one.
//!
//! Past the cap a new connection is accepted rather than left in the kernel's backlog. It
//! takes the slot of the oldest connection that has not checked anything yet (a peer that
//! has not proved itself: a probe, a scraper, anyone refused `401`), which is closed at
//! once; only when every open connection has checked is the new one closed instead, so a
//! gateway learns within a round trip that it must apply its failure mode. Flooding the
//! bridge with connections that never check therefore keeps no gateway out: to push a
//! gateway's new connection out, a flood would have to fill every slot in the moment between
//! its accept and its first check. A connection proves itself with its first check or gRPC
//! stream that `access` admits (with no token, every check is admitted).

use crate::ops::labels::Failure;
use crate::ops::metrics::{Metrics, Open};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How often refused and evicted connections are logged at most: a flood logs a count, not
/// a line per connection.
const LOGGED_EVERY: Duration = Duration::from_secs(10);
/// How long the accept loop waits for an evicted connection to give its slot back; it is
/// closed without a grace, so this is a task's turn, not a round trip.
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// The slots, taken by the accept loop.
pub struct Slots {
    free: Arc<Semaphore>,
    max: u32,
    /// Connections that had not checked when they were accepted, oldest first. Some have
    /// checked or ended since; they are skipped when a slot is needed.
    unproven: VecDeque<Weak<Peer>>,
    /// Connections refused and evicted since the last warning, and when that was.
    refused: u64,
    evicted: u64,
    warned_at: Option<Instant>,
}

/// What the bridge knows of one connection's peer.
#[derive(Default)]
pub struct Peer {
    proven: AtomicBool,
    evict: Notify,
}

impl Peer {
    /// The peer made a check the bridge admitted: its slot is no longer taken from it.
    pub fn prove(&self) {
        self.proven.store(true, Ordering::Relaxed);
    }

    pub fn is_proven(&self) -> bool {
        self.proven.load(Ordering::Relaxed)
    }

    /// Completes when the connection must close at once to make room for a new one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Slots {
    pub fn new(max: u32) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(max as usize)),
            max,
            unproven: VecDeque::new(),
            refused: 0,
            evicted: 0,
            warned_at: None,
        }
    }

    /// A slot for a new connection, held (and counted open in `metrics`) until it is
    /// dropped, and its peer; at the cap, the slot of the oldest unproven connection, or
    /// `None` if every connection has proved itself.
    pub async fn take(&mut self, metrics: &Metrics) -> Option<(Slot, Arc<Peer>)> {
        let mut permit = Arc::clone(&self.free).try_acquire_owned().ok();
        if permit.is_none() && self.evict_oldest() {
            metrics.failure(Failure::Evicted);
            self.evicted += 1;
            let freed = Arc::clone(&self.free).acquire_owned();
            permit = tokio::time::timeout(EVICTION_WAIT, freed)
                .await
                .ok()
                .and_then(Result::ok);
        }
        if permit.is_none() {
            metrics.failure(Failure::OverCapacity);
            self.refused += 1;
        }
        self.warn();
        let peer = Arc::new(Peer::default());
        self.remember(&peer);
        permit.map(|permit| {
            let slot = Slot {
                _permit: permit,
                _open: metrics.connection_opened(),
            };
            (slot, peer)
        })
    }

    /// Closes the oldest connection that has not proved itself, if there is one.
    fn evict_oldest(&mut self) -> bool {
        while let Some(peer) = self.unproven.pop_front() {
            if let Some(peer) = peer.upgrade().filter(|p| !p.is_proven()) {
                peer.evict.notify_one();
                return true;
            }
        }
        false
    }

    fn remember(&mut self, peer: &Arc<Peer>) {
        // Connections that ended or proved themselves would pile up while the cap is not
        // reached; dropped in one pass once they outnumber the slots.
        if self.unproven.len() >= 2 * self.max as usize {
            self.unproven
                .retain(|p| p.upgrade().is_some_and(|p| !p.is_proven()));
        }
        self.unproven.push_back(Arc::downgrade(peer));
    }

    fn warn(&mut self) {
        if self.refused + self.evicted == 0 {
            return;
        }
        let now = Instant::now();
        if self.warned_at.is_some_and(|at| now < at + LOGGED_EVERY) {
            return;
        }
        log::warn!(
            "{} connections open (--max-connections): closed {} new connection(s), and {} \
             that had not checked anything to make room",
            self.max,
            self.refused,
            self.evicted
        );
        (self.refused, self.evicted, self.warned_at) = (0, 0, Some(now));
    }

    /// Waits until every connection has ended, at most `timeout`.
    pub async fn drained(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.free.acquire_many(self.max))
            .await
            .is_ok()
    }
}

/// One connection's place under the cap, and in the `connections` gauge.
pub struct Slot {
    /// Given back to `Slots` when the connection ends.
    _permit: OwnedSemaphorePermit,
    /// Counts the connection open while it lives.
    _open: Open,
}
