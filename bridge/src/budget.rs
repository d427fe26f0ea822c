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
//! reply has waited `--write-timeout-ms` (`limits`).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What an exchange costs the budget per byte of its body: the body itself, the checks
/// parsed from it (a key and five numbers per rule) and the reply, with room for the
/// allocator's slack.
const CHARGE_PER_BYTE: usize = 4;
/// The unit of the budget's semaphore: a KiB, so that its permits fit a `u32` per charge.
const UNIT: usize = 1024;

/// The budget, shared by every connection.
#[derive(Clone)]
pub struct Budget {
    units: Arc<Semaphore>,
    max_units: u32,
}

/// An exchange's share of the budget, given back when dropped.
pub struct Charge {
    _units: OwnedSemaphorePermit,
}

impl Budget {
    /// A budget of `mib` MiB.
    pub fn new(mib: u32) -> Budget {
        let max_units = mib.saturating_mul((1024 * 1024 / UNIT) as u32).max(1);
        Budget {
            units: Arc::new(Semaphore::new(max_units as usize)),
            max_units,
        }
    }

    /// The share of an exchange of `body_bytes`, once the budget has it. An exchange larger
    /// than the whole budget waits until it has all of it, so it still goes through alone.
    /// `None` only if the budget were closed, which it never is.
    pub async fn charge(&self, body_bytes: usize) -> Option<Charge> {
        let units = (body_bytes.saturating_mul(CHARGE_PER_BYTE) / UNIT + 1)
            .min(self.max_units as usize) as u32;
        let units = Arc::clone(&self.units).acquire_many_owned(units).await;
        units.ok().map(|units| Charge { _units: units })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn charges_wait_until_the_budget_has_room_and_an_oversized_one_goes_alone() {
        let budget = Budget::new(1);
        // 4 bytes charged per byte: two charges of a bit less than half a MiB each.
        let half = budget.charge(120 * 1024).await.unwrap();
        let other = budget.charge(120 * 1024).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(50), budget.charge(30 * 1024));
        assert!(waiting.await.is_err(), "the budget is spent");
        drop(half);
        tokio::time::timeout(Duration::from_millis(50), budget.charge(1))
            .await
            .expect("room once a charge is given back");
        drop(other);
        tokio::time::timeout(Duration::from_millis(50), budget.charge(10 << 20))
            .await
            .expect("a charge larger than the budget takes all of it");
    }
}
