//! The overrides this bridge applies, as last read from Redis: every check reads them, so
//! they are kept in memory and replaced whole by `registry::refresh` every
//! `REFRESH_EVERY`. The bound on staleness is what makes an override reach every gateway
//! within a second: a table older than `MAX_AGE` (Redis has not answered since) is no longer
//! applied, so an override that expired or was cleared meanwhile never lingers.

use super::table::Table;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How often every bridge reads the overrides again.
pub const REFRESH_EVERY: Duration = Duration::from_millis(250);
/// The oldest table that is still applied: a few refreshes, under a second.
pub const MAX_AGE: Duration = Duration::from_millis(900);

/// The table in force and when it was read.
#[derive(Default)]
pub struct OverrideCache {
    current: RwLock<Option<(Arc<Table>, Instant)>>,
}

impl OverrideCache {
    /// The table to apply now: empty when none was read within `MAX_AGE`.
    pub fn table(&self) -> Arc<Table> {
        let current = match self.current.read() {
            Ok(current) => current,
            Err(poisoned) => poisoned.into_inner(),
        };
        match &*current {
            Some((table, read)) if read.elapsed() <= MAX_AGE => table.clone(),
            _ => Arc::default(),
        }
    }

    /// Replaces the table with one just read.
    pub fn replace(&self, table: Table) {
        let fresh = Some((Arc::new(table), Instant::now()));
        match self.current.write() {
            Ok(mut current) => *current = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::overrides::{Override, Target};
    use ratelimit_config::limit::Limit;

    #[test]
    fn a_table_is_applied_while_fresh_only() {
        let cache = OverrideCache::default();
        assert!(cache.table().is_empty());
        cache.replace(Table::new([Override {
            target: Target::new("rl", "r", &[]).unwrap(),
            limit: Limit::new(1, 1000, None, 1).unwrap(),
            expires_ms: 1,
        }]));
        assert!(cache.table().find("rl:r:x").is_some());
        std::thread::sleep(MAX_AGE + Duration::from_millis(50));
        assert!(cache.table().is_empty(), "a stale table is not applied");
    }
}
