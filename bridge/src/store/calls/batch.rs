//! How a batch of checks becomes script calls: one per Redis node (a few if very large),
//! each check all-or-nothing. Pure planning, so it can be tested alone; `tally` reads the
//! answers back, `commit` merges the calls of every exchange bound for one node.
//!
//! On a single server, and for a check whose buckets all live on one node of a Cluster,
//! a check is one part of one call: atomic where it runs. A check spanning nodes cannot be
//! atomic; it is made all-or-nothing with as little work as possible, and so that its own
//! denial never denies anyone else:
//! 1. its **own** buckets (those naming a client: `prefix:rule:value...`) are taken first,
//!    on every node at once;
//! 2. only if all of them admitted are its **shared** buckets (`prefix:rule`, one bucket
//!    for every client) taken, after a peek if they lie on several nodes;
//! 3. whatever took for a check that something denied is given back, which is only ever
//!    a client's own bucket, but for a race between the peek and the take of step 2.
//!
//! So a client over its own limit never touches a bucket it shares with others, and each
//! bucket is read once per check rather than peeked and then taken.

use super::commit::Fill;
use crate::store::check::{Check, RuleSpec};
use crate::store::topology::Topology;
use ratelimit_protocol::script::{part_rules, Part};

/// The work of one script call: parts of checks, in batch order, all on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    /// The node's index in the topology the plan was made with.
    pub node: usize,
    pub parts: Vec<Part>,
}

impl Call {
    /// Rules (= keys) the call carries.
    pub fn rules(&self) -> usize {
        self.parts.iter().map(|p| p.rules.len()).sum()
    }
}

/// A part and the node it goes to.
pub type Placed = (usize, Part);

/// What to send, in which order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Taken first: every check whole that lies on one node, and the own buckets of those
    /// spanning nodes.
    pub first: Vec<Placed>,
    /// The shared buckets of checks spanning nodes, taken once their own admitted.
    pub shared: Vec<Placed>,
    /// Per check: whether it spans nodes.
    pub spanning: Vec<bool>,
    /// Per check: whether its shared buckets lie on several nodes (they are peeked at
    /// before any of them takes).
    pub peek: Vec<bool>,
}

/// Whether `key` is a bucket every client shares: it names a rule and no client. Neither
/// key prefixes nor rule names hold a `:`, so such a key has one.
pub fn is_shared(key: &str) -> bool {
    key.bytes().filter(|&b| b == b':').count() == 1
}

/// Plans `checks` over the nodes of `topology`. A check without rules rides along in node
/// 0's call only to learn the Redis time.
pub fn plan(checks: &[Check], topology: &Topology) -> Plan {
    let mut plan = Plan {
        spanning: vec![false; checks.len()],
        peek: vec![false; checks.len()],
        ..Plan::default()
    };
    // Each rule's node, computed once (a key's slot is a CRC of it); reused check by check.
    let mut nodes: Vec<usize> = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        nodes.clear();
        if topology.len() >= 2 {
            nodes.extend(check.iter().map(|r| topology.node_of(&r.key)));
        }
        let node = nodes.first().copied().unwrap_or(0);
        if nodes.iter().all(|&n| n == node) {
            plan.first.push((node, Part::whole(i, check.len())));
            continue;
        }
        // (shared, node) and the rules there, in the check's order: a few places, so a
        // vector searched in turn costs less than a map.
        let mut places: Vec<((bool, usize), Vec<usize>)> = Vec::new();
        for (r, (rule, &node)) in check.iter().zip(&nodes).enumerate() {
            let place = (is_shared(&rule.key), node);
            match places.iter_mut().find(|(p, _)| *p == place) {
                Some((_, rules)) => rules.push(r),
                None => places.push((place, vec![r])),
            }
        }
        places.sort_unstable_by_key(|(place, _)| *place);
        plan.spanning[i] = true;
        let mut shared_nodes = 0;
        for ((shared, node), rules) in places {
            let part = (node, Part { check: i, rules });
            if shared {
                shared_nodes += 1;
                plan.shared.push(part);
            } else {
                plan.first.push(part);
            }
        }
        plan.peek[i] = shared_nodes > 1;
    }
    plan
}

/// `checks` with no lease asked by those `spanning` selects: a check spanning nodes takes
/// no lease, as a give-back after a denial elsewhere could not know what a lease took.
pub fn without_leases(checks: &[Check], spanning: &[bool]) -> Vec<Check> {
    checks
        .iter()
        .zip(spanning)
        .map(|(check, &spans)| {
            check
                .iter()
                .map(|r| RuleSpec {
                    lease: if spans { 0 } else { r.lease },
                    ..r.clone()
                })
                .collect()
        })
        .collect()
}

/// Puts `placed` parts (in batch order) into calls: one per node, split where one call
/// would grow past its bounds (keys, parts, shapes; see `Fill`). A part is never split, so
/// each part stays all-or-nothing.
pub fn group(checks: &[Check], mut placed: Vec<Placed>) -> Vec<Call> {
    // Stable: each node's parts stay in batch order.
    placed.sort_by_key(|(node, _)| *node);
    let mut calls: Vec<Call> = Vec::new();
    let mut fill = Fill::default();
    for (node, part) in placed {
        let joins =
            calls.last().is_some_and(|c| c.node == node) && fill.fits([part_rules(checks, &part)]);
        if !joins {
            calls.push(Call {
                node,
                parts: Vec::new(),
            });
            fill = Fill::default();
        }
        fill.add([part_rules(checks, &part)]);
        if let Some(call) = calls.last_mut() {
            call.parts.push(part);
        }
    }
    calls
}

/// The rules of each part of `call`, owned, for a lane (which outlives no exchange but
/// serves many at once).
pub fn rules_of(checks: &[Check], call: &Call) -> Vec<Check> {
    call.parts
        .iter()
        .map(|part| part_rules(checks, part).cloned().collect())
        .collect()
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
