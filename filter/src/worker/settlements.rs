//! A worker's settlements of metered rules until the backend has applied them: each sent
//! with the exchanges like any line, and sent again (with the same id, so never applied
//! twice) while its exchange fails, for a bounded time. The bookkeeping only; the
//! dispatcher queues what `due` returns.

use crate::decision::slots::Ids;
use hashbrown::HashMap;
use std::collections::VecDeque;

/// How long after a failure a settlement is sent again.
pub const RETRY_MS: u64 = 1_000;
/// How long a settlement is tried for; the script remembers an id for twice as long.
pub const GIVE_UP_MS: u64 = 60_000;
/// How many settlements a worker holds at most (about 200 bytes each): while the backend
/// is down, a busy worker gives up its oldest rather than grow without bound.
pub const MAX_PENDING: usize = 10_000;

#[derive(Debug)]
struct Pending {
    line: String,
    rules: usize,
    first_ms: u64,
    /// When to send it again; `None` while it is queued or out.
    due_ms: Option<u64>,
}

/// One worker's settlements not yet applied (and its slots' releases, which go again
/// alike).
#[derive(Debug, Default)]
pub struct Settlements {
    /// Names this worker's settlements apart from every other worker's and gateway's.
    ids: Ids,
    pending: HashMap<u32, Pending>,
    /// The numbers in the order they were added (some already done), oldest first.
    order: VecDeque<u32>,
}

impl Settlements {
    /// A fresh settlement's number and its id on the wire.
    pub fn fresh_id(&mut self) -> (u32, String) {
        self.ids.fresh()
    }

    /// Remembers settlement `id`'s line (of `rules` rules), queued now, until it is
    /// applied; how many older ones were given up on to stay within `MAX_PENDING`.
    pub fn add(&mut self, id: u32, line: &str, rules: usize, now_ms: u64) -> u64 {
        let pending = Pending {
            line: line.to_string(),
            rules,
            first_ms: now_ms,
            due_ms: None,
        };
        self.pending.insert(id, pending);
        self.order.push_back(id);
        let mut given_up = 0;
        while self.pending.len() > MAX_PENDING {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            given_up += u64::from(self.pending.remove(&oldest).is_some());
        }
        // Numbers done long ago leave the order now and then, so it stays within twice
        // the pending ones.
        if self.order.len() > 2 * self.pending.len() + 64 {
            let pending = &self.pending;
            self.order.retain(|id| pending.contains_key(id));
        }
        given_up
    }

    /// Settlement `id` was applied (or refused as malformed, which no retry mends);
    /// whether it was still held. One given up while its exchange was out was counted
    /// then, and must not be counted again when its answer comes.
    pub fn done(&mut self, id: u32) -> bool {
        self.pending.remove(&id).is_some()
    }

    /// Settlement `id`'s exchange failed: it goes again after `RETRY_MS`.
    pub fn failed(&mut self, id: u32, now_ms: u64) {
        if let Some(p) = self.pending.get_mut(&id) {
            p.due_ms = Some(now_ms.saturating_add(RETRY_MS));
        }
    }

    /// The settlements to send again now (number, line, rules), and how many were given
    /// up on (tried for `GIVE_UP_MS`).
    pub fn due(&mut self, now_ms: u64) -> (Vec<(u32, String, usize)>, u64) {
        let before = self.pending.len();
        self.pending
            .retain(|_, p| p.due_ms.is_none() || now_ms.saturating_sub(p.first_ms) < GIVE_UP_MS);
        let given_up = (before - self.pending.len()) as u64;
        let mut due = Vec::new();
        for (&id, p) in &mut self.pending {
            if p.due_ms.is_some_and(|at| at <= now_ms) {
                p.due_ms = None;
                due.push((id, p.line.clone(), p.rules));
            }
        }
        due.sort_unstable_by_key(|d| d.0);
        (due, given_up)
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_settlement_goes_again_with_its_line_until_it_is_applied_or_given_up() {
        let mut s = Settlements::default();
        let (a, wire_a) = s.fresh_id();
        let (b, wire_b) = s.fresh_id();
        assert_ne!(wire_a, wire_b);
        assert!(ratelimit_protocol::valid_settlement_id(&wire_a));
        s.add(a, "= a x\n", 1, 0);
        s.add(b, "= b y\n", 2, 0);
        assert_eq!(s.due(5_000).0, [], "queued or out: not due");
        s.failed(a, 100);
        assert_eq!(s.due(1_099).0, []);
        assert_eq!(s.due(1_100).0, [(a, "= a x\n".to_string(), 1)]);
        assert_eq!(s.due(1_200).0, [], "sent again: out");
        s.done(b);
        s.failed(a, 59_000);
        let (due, given_up) = s.due(GIVE_UP_MS);
        assert_eq!((due, given_up), (vec![], 1));
        assert!(s.is_empty());
    }

    #[test]
    fn a_worker_holding_its_most_settlements_gives_up_the_oldest_for_a_new_one() {
        let mut s = Settlements::default();
        let mut given_up = 0;
        let mut first = None;
        for i in 0..MAX_PENDING as u64 + 3 {
            let (id, _) = s.fresh_id();
            first.get_or_insert(id);
            given_up += s.add(id, "= x y\n", 1, i);
            if i == 1 {
                s.done(id);
            }
        }
        // One was done: of the three over the bound, two more were given up, the oldest.
        assert_eq!((given_up, s.len()), (2, MAX_PENDING));
        let first = first.unwrap();
        assert!(
            !s.done(first),
            "given up: its late answer is not a second ending"
        );
        assert!(s.done(first + 4), "still held");
        s.failed(first, 0);
        s.failed(first + 2, 0);
        s.failed(first + 3, 0);
        let due: Vec<u32> = s.due(RETRY_MS).0.iter().map(|d| d.0).collect();
        assert_eq!(due, [first + 3], "the oldest two are gone");
    }

    #[test]
    fn settlements_applied_as_they_come_leave_the_order_too() {
        let mut s = Settlements::default();
        for i in 0..1_000 {
            let (id, _) = s.fresh_id();
            assert_eq!(s.add(id, "= x y\n", 1, i), 0);
            s.done(id);
            assert!(
                s.order.len() <= 2 + 64,
                "{} numbers kept for one",
                s.order.len()
            );
        }
        assert!(s.is_empty());
    }
}
