//! How the store sends a batch's calls: each through its node's lane (`calls::commit`),
//! and, in a Cluster, the parts a node refused without running them sent again where their
//! buckets now live: where a fresh slot map says, or where the refusing node redirects them
//! (`ASK`, during a resharding). A part whose buckets no longer share a node fails rather
//! than run apart.

use super::calls::batch::{self, Call};
use super::calls::commit::{CallError, PartReply};
use super::check::Check;
use super::topology::Topology;
use super::{Store, CLUSTER_ATTEMPTS, CLUSTER_PAUSE};
use futures_util::future::join_all;
use ratelimit_protocol::script::{part_rules, Mode};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

impl Store {
    /// Sends `calls` in `mode`, all at once; their parts' replies, call by call.
    pub(super) async fn send(
        &self,
        mode: Mode,
        checks: &[Check],
        topology: &Topology,
        calls: &[Call],
    ) -> Vec<Vec<PartReply>> {
        join_all(
            calls
                .iter()
                .map(|call| self.run_call(mode, checks, topology, call)),
        )
        .await
    }

    /// One call through its node's lane; in a cluster, the parts it refused without
    /// running them go again where their buckets now live: where the slot map says, or
    /// where the node they were sent to redirects them (`redirects`: a slot migrating, its
    /// bucket already moved). A part whose buckets no longer share a node (a slot moved
    /// between them) fails: it would no longer be atomic.
    async fn run_call(
        &self,
        mode: Mode,
        checks: &[Check],
        topology: &Topology,
        call: &Call,
    ) -> Vec<PartReply> {
        let node = topology.name(call.node);
        let mut replies = self
            .lanes
            .submit(&node, mode, batch::rules_of(checks, call))
            .await;
        // Where each part was last sent.
        let mut sent_to = vec![node; call.parts.len()];
        for attempt in 1..CLUSTER_ATTEMPTS {
            let refused =
                |r: &PartReply| matches!(r, Err(CallError::NotRun(_) | CallError::Misplaced(_)));
            if !replies.iter().any(refused) {
                break;
            }
            tokio::time::sleep(CLUSTER_PAUSE * attempt).await;
            let fresh = self.read_topology().await;
            let redirects = self.redirects(checks, call, &replies, &sent_to).await;
            // Where each part goes now: a node's lane, or a node after `ASKING`.
            let mut again: BTreeMap<(Arc<str>, bool), Vec<usize>> = BTreeMap::new();
            for (i, part) in call.parts.iter().enumerate() {
                if !replies.get(i).is_some_and(refused) {
                    continue;
                }
                let (mut nodes, mut asking) = (Vec::new(), false);
                for rule in part_rules(checks, part) {
                    let redirect = redirects.get(&rule.key);
                    asking |= redirect.is_some();
                    let node = redirect.cloned();
                    nodes.push(node.unwrap_or_else(|| fresh.name(fresh.node_of(&rule.key))));
                }
                let first = nodes.first().cloned().unwrap_or_else(|| fresh.name(0));
                if nodes.iter().all(|n| *n == first) {
                    again.entry((first, asking)).or_default().push(i);
                } else if let Some(reply) = replies.get_mut(i) {
                    *reply = Err(CallError::Failed(
                        "the check's buckets moved apart during a resharding".into(),
                    ));
                }
            }
            let resent = join_all(again.iter().map(|((node, asking), parts)| {
                let rules = parts
                    .iter()
                    .filter_map(|&i| call.parts.get(i))
                    .map(|p| part_rules(checks, p).cloned().collect())
                    .collect();
                async move {
                    if *asking {
                        self.backend.call_asking(node, mode, rules).await
                    } else {
                        self.lanes.submit(node, mode, rules).await
                    }
                }
            }))
            .await;
            for (((node, _), parts), answers) in again.iter().zip(resent) {
                for (&i, answer) in parts.iter().zip(answers) {
                    if let Some(reply) = replies.get_mut(i) {
                        *reply = answer;
                    }
                    if let Some(to) = sent_to.get_mut(i) {
                        *to = node.clone();
                    }
                }
            }
        }
        replies
    }

    /// For the parts of `call` refused because their node does not hold one of the call's
    /// keys (a slot moved, or migrating with the bucket already on the target), where the
    /// node they were sent to redirects each of their keys.
    async fn redirects(
        &self,
        checks: &[Check],
        call: &Call,
        replies: &[PartReply],
        sent_to: &[Arc<str>],
    ) -> HashMap<String, Arc<str>> {
        // Each distinct key once per node: many checks of a call may share a bucket.
        let mut keys: BTreeMap<&Arc<str>, BTreeSet<&str>> = BTreeMap::new();
        for ((part, reply), node) in call.parts.iter().zip(replies).zip(sent_to) {
            if let Err(CallError::Misplaced(_)) = reply {
                let rules = part_rules(checks, part).map(|r| r.key.as_str());
                keys.entry(node).or_default().extend(rules);
            }
        }
        let asked = join_all(keys.into_iter().map(|(node, keys)| async move {
            let keys: Vec<&str> = keys.into_iter().collect();
            self.backend.redirects(node, &keys).await
        }))
        .await;
        asked.into_iter().flatten().collect()
    }
}
