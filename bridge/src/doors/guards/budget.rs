//! One bound on the memory of every exchange in the bridge at once (`--max-pending-mib`),
//! whichever connection, stream or transport it came on.
//!
//! Per-stream and per-connection bounds alone multiply: 64 messages on each of 256 streams
//! of each of 4,096 connections. A peer that sends and never reads its replies (an HTTP/2
//! window of 0) would hold every message it sent and its reply; 20 such streams took the
//! bridge from 5 to 463 MiB. So an exchange is charged against this budget from when it is
//! read until its reply has been handed to the connection to write; when the budget is spent,
//! the bridge stops reading (HTTP/2 flow control makes the peers wait) until replies go out.
//! A peer that never reads cannot hold its share for long: its connection is closed once a
//! reply has waited `--write-timeout-ms` (`deadlines`). Nor can a few peers take all of it
//! meanwhile: one connection holds at most `1/CONNECTION_SHARE` of the budget (its exchanges
//! past that wait on its own, not the others'), so the peers that stopped reading need a
//! `CONNECTION_SHARE`-th of the budget each to keep the others waiting.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What an exchange costs the budget per byte of its body: the body itself, the checks
/// parsed from it (a key and five numbers per rule) and the reply, with room for the
/// allocator's slack.
const CHARGE_PER_BYTE: usize = 4;
/// The unit of the budget's semaphores: a KiB, so that its permits fit a `u32` per charge.
const UNIT: usize = 1024;
/// One connection may hold this fraction of the budget at most. A gateway worker keeps
/// about one message in flight on its stream (the filter's group commit), of at most
/// 256 KiB: the share of a default budget (4 MiB) holds four of the largest at once.
const CONNECTION_SHARE: u32 = 64;

/// The budget, shared by every connection.
#[derive(Clone)]
pub struct Budget {
    pool: Pool,
    /// Each connection's share.
    share_units: u32,
}

/// Units of memory, taken and given back.
#[derive(Clone)]
struct Pool {
    units: Arc<Semaphore>,
    max_units: u32,
}

impl Pool {
    fn new(max_units: u32) -> Pool {
        Pool {
            units: Arc::new(Semaphore::new(max_units as usize)),
            max_units,
        }
    }

    /// `units`, at most the whole pool, once it has them. `None` only if the pool were
    /// closed, which it never is.
    async fn take(&self, units: u32) -> Option<OwnedSemaphorePermit> {
        let units = units.min(self.max_units);
        Arc::clone(&self.units).acquire_many_owned(units).await.ok()
    }
}

/// One connection's share of the budget.
#[derive(Clone)]
pub struct Share {
    own: Pool,
    budget: Pool,
}

/// An exchange's part of its connection's share and of the budget, given back when dropped.
pub struct Charge {
    _own: OwnedSemaphorePermit,
    _budget: OwnedSemaphorePermit,
}

impl Budget {
    /// A budget of `mib` MiB.
    pub fn new(mib: u32) -> Budget {
        let max_units = mib.saturating_mul((1024 * 1024 / UNIT) as u32).max(1);
        Budget {
            pool: Pool::new(max_units),
            share_units: (max_units / CONNECTION_SHARE).max(1),
        }
    }

    /// The share of a new connection.
    pub fn share(&self) -> Share {
        Share {
            own: Pool::new(self.share_units),
            budget: self.pool.clone(),
        }
    }
}

impl Share {
    /// The part of an exchange of `body_bytes`, once the connection's share and then the
    /// budget have it. An exchange larger than the share waits until it has all of it, so
    /// it still goes through alone. `None` only if a pool were closed, which none is.
    pub async fn charge(&self, body_bytes: usize) -> Option<Charge> {
        let units = body_bytes.saturating_mul(CHARGE_PER_BYTE) / UNIT + 1;
        let units = u32::try_from(units)
            .unwrap_or(u32::MAX)
            .min(self.own.max_units);
        let own = self.own.take(units).await?;
        let budget = self.budget.take(units).await?;
        Some(Charge {
            _own: own,
            _budget: budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn waits(share: &Share, bytes: usize) -> bool {
        let charge = tokio::time::timeout(Duration::from_millis(50), share.charge(bytes));
        charge.await.is_err()
    }

    #[tokio::test]
    async fn a_connection_waits_past_its_share_and_everyone_past_the_budget() {
        // 64 MiB: 1 MiB a connection; 4 bytes charged per byte.
        let budget = Budget::new(64);
        let first = budget.share();
        let most = first.charge(200 * 1024).await.unwrap();
        assert!(waits(&first, 100 * 1024).await, "past its share");
        let second = budget.share();
        assert!(
            !waits(&second, 100 * 1024).await,
            "another connection has its own"
        );
        drop(most);
        assert!(
            !waits(&first, 100 * 1024).await,
            "room once a charge is given back"
        );
        let big = first.charge(10 << 20).await.unwrap();
        assert!(
            waits(&first, 1).await,
            "a charge larger than the share takes all of it"
        );
        drop(big);
        // The budget: 64 connections at their share spend it.
        let shares: Vec<_> = (0..64).map(|_| budget.share()).collect();
        let mut held = Vec::new();
        for share in &shares {
            held.push(share.charge(256 * 1024).await.unwrap());
        }
        assert!(waits(&budget.share(), 1024).await, "the budget is spent");
        held.pop();
        assert!(!waits(&budget.share(), 1024).await);
    }
}
