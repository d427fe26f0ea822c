//! The slot map a store plans its calls with, kept fresh: read from the Cluster when first
//! needed and again when a call was refused for a slot that moved, but at most once every
//! `TOPOLOGY_GAP` however many calls a move refuses; with sentinels, the one node named
//! after the master now known (its lane and metrics follow it).

use crate::store::connection::backend::Backend;
use crate::store::topology::Topology;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The slot map is read again at most this often, however many calls a move refuses.
const TOPOLOGY_GAP: Duration = Duration::from_millis(20);

/// The current slot map, shared by every clone of a store.
#[derive(Clone)]
pub struct SlotMap {
    /// Empty until a cluster is first reached.
    current: Arc<RwLock<Arc<Topology>>>,
    /// When the map was last read: one read serves every call a move refused.
    read_at: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl SlotMap {
    pub fn new(topology: Topology) -> SlotMap {
        SlotMap {
            current: Arc::new(RwLock::new(Arc::new(topology))),
            read_at: Arc::default(),
        }
    }

    /// The slot map, read now if none was yet.
    pub async fn get(&self, backend: &Backend) -> Arc<Topology> {
        let current = self.current();
        if !current.is_empty() {
            return current;
        }
        self.read(backend).await
    }

    fn current(&self) -> Arc<Topology> {
        match self.current.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the slot map again (a cluster only), unless it was read a moment ago. With
    /// sentinels, the one node is named after the master now known.
    pub async fn read(&self, backend: &Backend) -> Arc<Topology> {
        if !backend.is_cluster() {
            let current = self.current();
            return match backend.master() {
                Some(master) if current.name(0) != master => self.set(Topology::single_at(master)),
                _ => current,
            };
        }
        let mut read_at = self.read_at.lock().await;
        if read_at.is_some_and(|at| at.elapsed() < TOPOLOGY_GAP) {
            return self.current();
        }
        match backend.topology().await {
            Ok(fresh) => {
                *read_at = Some(Instant::now());
                self.set(fresh)
            }
            Err(e) => {
                log::debug!("cannot read the cluster's slot map: {e}");
                self.current()
            }
        }
    }

    fn set(&self, fresh: Topology) -> Arc<Topology> {
        let fresh = Arc::new(fresh);
        match self.current.write() {
            Ok(mut t) => *t = fresh.clone(),
            Err(poisoned) => *poisoned.into_inner() = fresh.clone(),
        }
        fresh
    }
}
