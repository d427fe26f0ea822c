//! What one connection may hold, so that clients that open connections and then stall
//! (slowloris), or never read what they are sent, cannot exhaust the bridge or starve the
//! gateways.
//!
//! - At most `max_connections` at once, and a gateway always gets one (`slots`).
//! - A connection with no request in progress must complete the headers of its next
//!   request within `header_timeout`, or it is closed. This covers every way of holding a
//!   slot without asking anything: sending nothing (hyper-util's protocol sniffing has no
//!   timeout of its own), partial HTTP/1 headers, a stalled HTTP/2 handshake, an HTTP/2
//!   connection without streams. A request in progress (an open gRPC stream) keeps its
//!   connection however long it idles; its body has deadlines of its own (`server`, `grpc`).
//!   An answer sent is no request in progress, even while its peer does not read it.
//! - An answer (a reply on the stream, or a callout's) that the connection could not take
//!   to write within `write_timeout`, because its peer grants no HTTP/2 window or does not
//!   read its socket, closes the connection at once, with everything it held: a gateway
//!   reads its replies as they come.
//!
//! So every slot an attacker holds is free again within `header_timeout` (plus
//! `body_timeout` once headers are in, or `write_timeout` once an answer waits), and the
//! memory it held with it (`budget`).

use super::slots::{Peer, Slot};
use crate::ops::labels::Failure;
use crate::store::Store;
use hyper_util::server::graceful::GracefulConnection;
use std::fmt::Display;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Bounds on what clients may hold; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionBounds {
    /// Longest a connection may go without a request in progress before the next request's
    /// headers are complete.
    pub header_timeout: Duration,
    /// Longest a request body (`POST /v1/check`), or one message on the gRPC stream, may
    /// take to arrive once it has begun.
    pub body_timeout: Duration,
    /// Longest an answer may wait for its connection to take it to write.
    pub write_timeout: Duration,
    /// Connections served at once.
    pub max_connections: u32,
    /// The memory every exchange in the bridge may hold at once, in MiB (`budget`).
    pub max_pending_mib: u32,
}

/// Longest wait at shutdown for a connection's requests in progress to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for an idle connection to close gracefully: one round trip (HTTP/2 answers
/// GOAWAY with a PING first); a peer that does not take part is cut off.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Requests in progress on one connection, watched by its idle deadline, and answers
/// waiting to be written, watched by its write deadline.
#[derive(Clone, Default)]
pub struct Activity(Arc<Watched>);

#[derive(Default)]
struct Watched {
    counts: watch::Sender<Counts>,
    /// Answers waiting, counted by the period they began to wait in (`Unwritten`).
    waiting: [AtomicUsize; PERIODS],
    /// The current period: the write deadline's watch moves it on every half deadline.
    period: AtomicUsize,
}

/// The periods answers are counted in: the current one, the one before, and the one that
/// the watch checks is empty before it is counted in again.
const PERIODS: usize = 3;

/// An answer waiting for its connection to take it; dropped once the connection has.
pub struct Unwritten {
    activity: Activity,
    period: usize,
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        self.activity.0.waiting[self.period].fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Default)]
struct Counts {
    in_progress: usize,
    /// Requests ever started: tells a request that came and went apart from no request.
    started: u64,
}

/// A request in progress; it ends when this is dropped (with the response body).
pub struct Busy(Activity);

impl Activity {
    pub fn busy(&self) -> Busy {
        self.0.counts.send_modify(|c| {
            c.in_progress += 1;
            c.started += 1;
        });
        Busy(self.clone())
    }

    /// Completes once the connection has had no request in progress, and none started, for
    /// `timeout` in a row.
    async fn idle_for(&self, timeout: Duration) {
        let mut counts = self.0.counts.subscribe();
        loop {
            let started = match counts.wait_for(|c| c.in_progress == 0).await {
                Ok(c) => c.started,
                Err(_) => return,
            };
            let woken = counts.wait_for(|c| c.in_progress > 0 || c.started != started);
            if tokio::time::timeout(timeout, woken).await.is_err() {
                return;
            }
        }
    }

    /// An answer now waiting to be written.
    pub fn unwritten(&self) -> Unwritten {
        let period = self.0.period.load(Ordering::Relaxed) % PERIODS;
        self.0.waiting[period].fetch_add(1, Ordering::Relaxed);
        Unwritten {
            activity: self.clone(),
            period,
        }
    }

    /// Completes once an answer has waited `timeout` or more (at most half as long again).
    /// Counting answers by half-deadline periods costs two atomic additions an answer, where
    /// a list of them would cost a lock and an allocation.
    async fn write_stalled(&self, timeout: Duration) {
        let mut ticks = tokio::time::interval(timeout / 2);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            // The period about to begin is the one two half deadlines ago: an answer still
            // counted in it has waited at least the whole deadline.
            let next = self.0.period.load(Ordering::Relaxed).wrapping_add(1);
            if self.0.waiting[next % PERIODS].load(Ordering::Relaxed) > 0 {
                return;
            }
            self.0.period.store(next, Ordering::Relaxed);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0 .0.counts.send_modify(|c| c.in_progress -= 1);
    }
}

/// What ended a connection's normal life.
enum End<E> {
    /// It ended by itself.
    Ended(E),
    /// It closes gracefully within this.
    Graceful(Duration),
    /// It is closed at once.
    Cut,
}

/// One connection's holdings and how it is watched.
pub struct Connection {
    pub activity: Activity,
    pub peer: Arc<Peer>,
    pub slot: Slot,
}

/// Drives one connection to its end: closes it gracefully once it idles past
/// `header_timeout` (within `IDLE_GRACE`) or when `stop` turns true (giving what is in
/// progress `DRAIN_TIMEOUT`); at once when an answer waits past `write_timeout` or its slot
/// is taken for a new connection. The slot is given back when it ends.
pub async fn drive<C>(
    conn: C,
    held: Connection,
    bounds: ConnectionBounds,
    mut stop: watch::Receiver<bool>,
    store: Store,
) where
    C: GracefulConnection,
    C::Error: Display,
{
    let mut conn = pin!(conn);
    let Connection {
        activity,
        peer,
        slot,
    } = held;
    let header_timeout = bounds.header_timeout;
    let end = tokio::select! {
        ended = conn.as_mut() => End::Ended(ended),
        () = activity.idle_for(header_timeout) => {
            log::debug!("closing a connection idle for {header_timeout:?}");
            End::Graceful(IDLE_GRACE)
        }
        () = activity.write_stalled(bounds.write_timeout) => {
            // A warning for a peer that has checked (a gateway, or a token holder); anyone
            // else could flood the log with connections that never read their 401.
            let level = if peer.is_proven() { log::Level::Warn } else { log::Level::Debug };
            log::log!(
                level,
                "closed a connection whose peer took no answer for {:?} (--write-timeout-ms)",
                bounds.write_timeout
            );
            store.metrics().failure(Failure::WriteTimeout);
            End::Cut
        }
        () = peer.evicted() => {
            log::debug!("closed a connection that had not checked, to make room");
            End::Cut
        }
        _ = stop.wait_for(|stop| *stop) => End::Graceful(DRAIN_TIMEOUT),
    };
    let ended = match end {
        End::Ended(ended) => Some(ended),
        End::Cut => None,
        End::Graceful(grace) => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(grace, conn).await.ok()
        }
    };
    if let Some(Err(e)) = ended {
        log::debug!("connection ended: {e}");
    }
    drop(slot);
}
