//! The unit tests' shared builders: a rule, and a two-node cluster's slot map.

use crate::store::check::RuleSpec;
use crate::store::topology::Topology;
use redis::Value;

/// A rule on `key` with a bucket of `burst`, refilling a token a millisecond, costing one.
pub fn rule(key: &str, burst: u64) -> RuleSpec {
    RuleSpec::plain(key, burst, 1, 1, 1)
}

/// Two nodes: A serves slots 0-8191 (hash tags `{b}`, `{c}`, `{g}`), B the rest (`{a}`,
/// `{x}`, `{y}`).
pub fn two_nodes() -> Topology {
    let node = |port| {
        Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
        ])
    };
    Topology::from_cluster_slots(&Value::Array(vec![
        Value::Array(vec![Value::Int(0), Value::Int(8191), node(7000)]),
        Value::Array(vec![Value::Int(8192), Value::Int(16383), node(7001)]),
    ]))
    .unwrap()
}
