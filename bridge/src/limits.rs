//! What one connection may hold, so that clients that open connections and then stall
//! (slowloris) cannot exhaust the bridge or starve the gateways.
//!
//! - At most `max_connections` at once. Past the cap a new connection is accepted and
//!   closed at once rather than left in the kernel's backlog: a gateway learns within a
//!   round trip that it must apply its failure mode, instead of waiting out its connect
//!   timeout behind connections that may be an attacker's.
//! - A connection with no request in progress must complete the headers of its next
//!   request within `header_timeout`, or it is closed. This covers every way of holding a
//!   slot without asking anything: sending nothing (hyper-util's protocol sniffing has no
//!   timeout of its own), partial HTTP/1 headers, a stalled HTTP/2 handshake, an HTTP/2
//!   connection without streams. A request in progress (an open gRPC stream) keeps its
//!   connection however long it idles; its body has deadlines of its own (`server`, `grpc`).
//!
//! So every slot an attacker holds is free again within `header_timeout` (plus
//! `body_timeout` once headers are in), and a gateway gets one back within seconds.

use crate::metrics::{Failure, Metrics, Open};
use hyper_util::server::graceful::GracefulConnection;
use std::fmt::Display;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bounds on what clients may hold; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest a connection may go without a request in progress before the next request's
    /// headers are complete.
    pub header_timeout: Duration,
    /// Longest a request body (`POST /v1/check`), or one message on the gRPC stream, may
    /// take to arrive once it has begun.
    pub body_timeout: Duration,
    /// Connections served at once.
    pub max_connections: u32,
}

/// Longest wait at shutdown for a connection's requests in progress to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for an idle connection to close gracefully: one round trip (HTTP/2 answers
/// GOAWAY with a PING first); a peer that does not take part is cut off.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// How often refused connections are logged at most: a flood logs a count, not a line per
/// connection.
const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(10);

/// The connection slots, taken by the accept loop.
pub struct Slots {
    free: Arc<Semaphore>,
    max: u32,
    /// Connections refused since the last warning, and when that was.
    refused: u64,
    warned_at: Option<Instant>,
}

impl Slots {
    pub fn new(max: u32) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(max as usize)),
            max,
            refused: 0,
            warned_at: None,
        }
    }

    /// A slot for a new connection, held (and counted open in `metrics`) until it is
    /// dropped; `None` at the cap.
    pub fn take(&mut self, metrics: &Metrics) -> Option<Slot> {
        let slot = Arc::clone(&self.free).try_acquire_owned().ok();
        if slot.is_none() {
            metrics.failure(Failure::OverCapacity);
            self.refused += 1;
            let now = Instant::now();
            if self
                .warned_at
                .is_none_or(|at| now >= at + REFUSALS_LOGGED_EVERY)
            {
                log::warn!(
                    "{} connections open (--max-connections): closed {} new connection(s)",
                    self.max,
                    self.refused
                );
                (self.refused, self.warned_at) = (0, Some(now));
            }
        }
        slot.map(|permit| Slot {
            _permit: permit,
            _open: metrics.connection_opened(),
        })
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

/// Requests in progress on one connection, watched by the connection's idle deadline.
#[derive(Clone, Default)]
pub struct Activity(Arc<watch::Sender<Counts>>);

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
        self.0.send_modify(|c| {
            c.in_progress += 1;
            c.started += 1;
        });
        Busy(self.clone())
    }

    /// Completes once the connection has had no request in progress, and none started, for
    /// `timeout` in a row.
    async fn idle_for(&self, timeout: Duration) {
        let mut counts = self.0.subscribe();
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
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0 .0.send_modify(|c| c.in_progress -= 1);
    }
}

/// Drives one connection to its end: closes it gracefully once it idles past
/// `header_timeout` (within `IDLE_GRACE`) or when `stop` turns true (giving what is in
/// progress `DRAIN_TIMEOUT`). `slot` is given back when it ends.
pub async fn drive<C>(
    conn: C,
    activity: Activity,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    slot: Slot,
) where
    C: GracefulConnection,
    C::Error: Display,
{
    let mut conn = pin!(conn);
    let grace = tokio::select! {
        ended = conn.as_mut() => Err(ended),
        () = activity.idle_for(header_timeout) => {
            log::debug!("closing a connection idle for {header_timeout:?}");
            Ok(IDLE_GRACE)
        }
        _ = stop.wait_for(|stop| *stop) => Ok(DRAIN_TIMEOUT),
    };
    let ended = match grace {
        Err(ended) => Some(ended),
        Ok(grace) => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(grace, conn).await.ok()
        }
    };
    if let Some(Err(e)) = ended {
        log::debug!("connection ended: {e}");
    }
    drop(slot);
}
