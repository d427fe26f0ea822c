//! Which Redis Cluster node serves each hash slot, as the bridge last read it
//! (`CLUSTER SLOTS`), so that a batch costs one script call per node rather than one per
//! slot: a node runs a call over keys of any of its slots (see `docs/token-bucket.md`).
//!
//! The map may be stale (a slot moved, a primary failed over). That costs a refused call,
//! never a wrong answer: a node refuses a key it does not serve before the script writes
//! anything, and the store then reads the map again and sends the call where it now
//! belongs.

use crate::store::slot::{slot, SLOTS};
use redis::Value;
use std::sync::Arc;

/// The primaries and the slots each one serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Each primary's `host:port`, which names its lane of calls.
    nodes: Vec<Arc<str>>,
    /// For each slot, its primary's index in `nodes`; `UNSERVED` for a slot no node serves.
    owners: Vec<u16>,
}

/// The owner of a slot no node serves (a cluster being set up, or failing).
const UNSERVED: u16 = u16::MAX;

impl Topology {
    /// A single server: every key on node 0.
    pub fn single() -> Topology {
        Topology::single_at(Arc::from("single"))
    }

    /// A single server named `name` (the master's address, with sentinels).
    pub fn single_at(name: Arc<str>) -> Topology {
        Topology {
            nodes: vec![name],
            owners: Vec::new(),
        }
    }

    /// A cluster not reached yet: no node serves any slot.
    pub fn unknown() -> Topology {
        Topology {
            nodes: Vec::new(),
            owners: vec![UNSERVED; usize::from(SLOTS)],
        }
    }

    /// Reads a `CLUSTER SLOTS` reply: `[start, end, [host, port, ...], replicas...]` per
    /// range.
    pub fn from_cluster_slots(reply: &Value) -> Result<Topology, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS answered {reply:?}"));
        };
        let mut topology = Topology::unknown();
        for range in ranges {
            let fields = match range {
                Value::Array(fields) => fields.as_slice(),
                _ => &[],
            };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(format!("CLUSTER SLOTS: a range reads {range:?}"));
            };
            let (start, end) = (integer(start)?, integer(end)?);
            let host = match primary.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                other => return Err(format!("CLUSTER SLOTS: a node's host reads {other:?}")),
            };
            let port = primary.get(1).map(integer).transpose()?.unwrap_or(0);
            if start > end || end >= u64::from(SLOTS) {
                return Err(format!("CLUSTER SLOTS: a range {start}-{end}"));
            }
            let address = format!("{host}:{port}");
            let index = match topology.nodes.iter().position(|n| **n == *address) {
                Some(i) => i,
                None => {
                    topology.nodes.push(Arc::from(address));
                    topology.nodes.len() - 1
                }
            };
            let index = u16::try_from(index).map_err(|_| "CLUSTER SLOTS: too many nodes")?;
            for owner in &mut topology.owners[start as usize..=end as usize] {
                *owner = index;
            }
        }
        Ok(topology)
    }

    /// The index of the node that serves `key`: 0 on a single server. A key of a slot no
    /// node serves gets node 0 as well: its call fails there, and it fails alone (its part
    /// is sent again or fails; see the store).
    pub fn node_of(&self, key: &str) -> usize {
        if self.owners.is_empty() {
            return 0;
        }
        match self.owners.get(usize::from(slot(key.as_bytes()))) {
            Some(&owner) if owner != UNSERVED => usize::from(owner),
            _ => 0,
        }
    }

    /// The name of node `index` (`host:port`, or `single`).
    pub fn name(&self, index: usize) -> Arc<str> {
        self.nodes
            .get(index)
            .cloned()
            .unwrap_or_else(|| Arc::from("unknown"))
    }

    /// How many nodes serve slots.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node serves any slot (a cluster that is not set up yet).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

fn integer(value: &Value) -> Result<u64, String> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| format!("CLUSTER SLOTS: {n}")),
        other => Err(format!("CLUSTER SLOTS: expected a number, got {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, primary: Value) -> Value {
        Value::Array(vec![Value::Int(start), Value::Int(end), primary])
    }

    #[test]
    fn keys_go_to_the_node_serving_their_slot() {
        let reply = Value::Array(vec![
            range(0, 8000, node("127.0.0.1", 7000)),
            range(8001, 16383, node("127.0.0.1", 7001)),
        ]);
        let topology = Topology::from_cluster_slots(&reply).unwrap();
        assert_eq!(topology.len(), 2);
        // "bar" is slot 5061, "foo" slot 12182.
        assert_eq!(&*topology.name(topology.node_of("bar")), "127.0.0.1:7000");
        assert_eq!(&*topology.name(topology.node_of("foo")), "127.0.0.1:7001");
        assert_eq!(topology.node_of("{bar}x"), topology.node_of("bar"));
    }

    #[test]
    fn a_node_serving_several_ranges_is_one_node() {
        let reply = Value::Array(vec![
            range(0, 10, node("h", 1)),
            range(11, 16000, node("g", 2)),
            range(16001, 16383, node("h", 1)),
        ]);
        let topology = Topology::from_cluster_slots(&reply).unwrap();
        assert_eq!(topology.len(), 2);
    }

    #[test]
    fn replies_that_are_not_a_slot_map_are_errors() {
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(5, 4, node("h", 1))]),
            Value::Array(vec![range(0, 16384, node("h", 1))]),
            Value::Array(vec![range(0, 1, Value::Int(3))]),
        ] {
            assert!(Topology::from_cluster_slots(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_single_server_is_one_node() {
        let topology = Topology::single();
        assert_eq!(topology.node_of("anything"), 0);
        assert_eq!(&*topology.name(0), "single");
    }
}
