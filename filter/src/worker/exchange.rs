//! Group commit: a worker keeps at most `max_inflight` exchanges with the bridge in flight;
//! the checks that arrive meanwhile wait, and leave together in one exchange the moment an
//! exchange comes back. No timer: the batch size follows the load by itself (1 when idle,
//! many under load), and every check is still decided exactly and answered on its own.
//!
//! Plain bookkeeping, host-independent: the glue sends what `take` returns and reports
//! what came back with `complete`.

use crate::wire::redis_call::batch_mode;
use hashbrown::HashMap;
use ratelimit_protocol::script::Mode;
use ratelimit_protocol::script::MAX_KEYS_PER_CALL;
use ratelimit_protocol::{MAX_BODY, MAX_CHECKS};
use std::collections::VecDeque;

/// Most checks one exchange carries: well under the bridge's `MAX_CHECKS`, and small
/// enough that one slow batch never holds many requests.
pub const MAX_BATCH: usize = 256;
const _: () = assert!(MAX_BATCH <= MAX_CHECKS);

/// A check of an exchange: its request and how many rules its line carries, which its
/// line of the reply must answer even if the request has gone meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub context_id: u32,
    pub rules: usize,
    /// A lease's top-up, for no request: the id its answer goes back to
    /// (`Leases::topped_up`).
    pub top_up: Option<u32>,
    /// A metered request's settlement, for no request: its number (`Settlements`).
    pub settlement: Option<u32>,
}

/// The context id of a member that is no request (a lease's return or top-up, a
/// settlement): the host
/// never gives it to a context.
pub const NO_REQUEST: u32 = 0;

#[derive(Debug)]
struct Waiting {
    member: Member,
    line: String,
    /// The script mode of its line: the redis-call build sends one mode per exchange.
    mode: Mode,
}

#[derive(Debug)]
struct InFlight {
    members: Vec<Member>,
    sent_ms: u64,
}

/// One worker's exchanges in flight and checks waiting.
#[derive(Debug, Default)]
pub struct Exchanges {
    max_inflight: u32,
    /// Checks, lease returns and settlements never share an exchange, and one carries at most
    /// `MAX_KEYS_PER_CALL` keys: the redis-call build runs one exchange as one script call,
    /// which has one mode and that bound.
    one_mode: bool,
    next_id: u32,
    inflight: HashMap<u32, InFlight>,
    queue: VecDeque<Waiting>,
}

impl Exchanges {
    pub fn new(max_inflight: u32) -> Exchanges {
        Exchanges {
            max_inflight,
            ..Exchanges::default()
        }
    }

    /// Keeps checks, lease returns and settlements in separate exchanges from now on.
    pub fn set_one_mode(&mut self, one_mode: bool) {
        self.one_mode = one_mode;
    }

    /// A new configuration's limit; what is in flight or waiting stays.
    pub fn set_max_inflight(&mut self, max_inflight: u32) {
        self.max_inflight = max_inflight;
    }

    /// Queues a check's line (see `wire`) until `take` sends it.
    pub fn enqueue(&mut self, context_id: u32, rules: usize, line: String) {
        let member = Member {
            context_id,
            rules,
            top_up: None,
            settlement: None,
        };
        self.push(member, line);
    }

    /// Queues settlement `id`'s line (see `Settlements`).
    pub fn enqueue_settlement(&mut self, id: u32, rules: usize, line: String) {
        let member = Member {
            context_id: NO_REQUEST,
            rules,
            top_up: None,
            settlement: Some(id),
        };
        self.push(member, line);
    }

    /// Queues lease top-up `id`'s line (one rule).
    pub fn enqueue_top_up(&mut self, id: u32, line: String) {
        let member = Member {
            context_id: NO_REQUEST,
            rules: 1,
            top_up: Some(id),
            settlement: None,
        };
        self.push(member, line);
    }

    fn push(&mut self, member: Member, line: String) {
        let mode = batch_mode(&line);
        self.queue.push_back(Waiting { member, line, mode });
    }

    /// Whether another exchange may leave now.
    pub fn has_room(&self) -> bool {
        self.max_inflight == 0 || self.inflight.len() < self.max_inflight as usize
    }

    pub fn is_waiting(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The next exchange to send, if there is room and something waits: its id and body,
    /// the waiting checks in order, bounded by `MAX_BATCH` and the bridge's `MAX_BODY`.
    pub fn take(&mut self, now_ms: u64) -> Option<(u32, String)> {
        if !self.has_room() || self.queue.is_empty() {
            return None;
        }
        let mut members = Vec::new();
        let mut body = String::new();
        let mut keys = 0;
        let mode = self.queue.front().map(|w| w.mode);
        while let Some(next) = self.queue.front() {
            let full = members.len() == MAX_BATCH
                || body.len() + next.line.len() > MAX_BODY
                || (self.one_mode
                    && (Some(next.mode) != mode || keys + next.member.rules > MAX_KEYS_PER_CALL));
            if full && !members.is_empty() {
                break;
            }
            let Some(waiting) = self.queue.pop_front() else {
                break;
            };
            keys += waiting.member.rules;
            members.push(waiting.member);
            body.push_str(&waiting.line);
        }
        let id = self.fresh_id();
        self.inflight.insert(
            id,
            InFlight {
                members,
                sent_ms: now_ms,
            },
        );
        Some((id, body))
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            if !self.inflight.contains_key(&self.next_id) {
                return self.next_id;
            }
        }
    }

    /// Exchange `id` came back (or failed): its members, in body order; `None` for an
    /// exchange already given up (a late reply).
    pub fn complete(&mut self, id: u32) -> Option<Vec<Member>> {
        self.inflight.remove(&id).map(|e| e.members)
    }

    /// Whether exchange `id` is still out (not answered, not given up).
    pub fn in_flight(&self, id: u32) -> bool {
        self.inflight.contains_key(&id)
    }

    /// Forgets the waiting check of a request that went away; whether it was waiting (not
    /// out in an exchange).
    pub fn forget(&mut self, context_id: u32) -> bool {
        let before = self.queue.len();
        self.queue.retain(|w| w.member.context_id != context_id);
        self.queue.len() < before
    }

    /// Gives up the exchanges sent `timeout_ms` or more before `now_ms`.
    pub fn expire(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<Vec<Member>> {
        let late: Vec<u32> = self
            .inflight
            .iter()
            .filter(|(_, e)| now_ms.saturating_sub(e.sent_ms) >= timeout_ms)
            .map(|(&id, _)| id)
            .collect();
        late.into_iter()
            .filter_map(|id| self.complete(id))
            .collect()
    }

    /// Gives up everything in flight (the transport broke).
    pub fn abandon_all(&mut self) -> Vec<Vec<Member>> {
        self.inflight.drain().map(|(_, e)| e.members).collect()
    }

    /// Takes every waiting check out of the queue.
    pub fn drain_waiting(&mut self) -> Vec<Member> {
        self.queue.drain(..).map(|w| w.member).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(members: &[Member]) -> Vec<u32> {
        members.iter().map(|m| m.context_id).collect()
    }

    #[test]
    fn an_idle_worker_sends_each_check_at_once() {
        let mut x = Exchanges::new(2);
        x.enqueue(1, 1, "a\n".into());
        let (id, body) = x.take(0).unwrap();
        assert_eq!(body, "a\n");
        assert_eq!(ids(&x.complete(id).unwrap()), [1]);
        assert!(x.complete(id).is_none(), "answered once");
    }

    #[test]
    fn checks_wait_while_the_limit_is_out_and_leave_together_when_one_returns() {
        let mut x = Exchanges::new(2);
        let mut sent = Vec::new();
        for ctx in 1..=2 {
            x.enqueue(ctx, 1, format!("c{ctx}\n"));
            sent.push(x.take(0).unwrap().0);
        }
        for ctx in 3..=5 {
            x.enqueue(ctx, 2, format!("c{ctx}\n"));
            assert!(x.take(0).is_none(), "no room");
        }
        assert!(!x.has_room() && x.is_waiting());
        assert_eq!(ids(&x.complete(sent[0]).unwrap()), [1]);
        let (batch, body) = x.take(0).unwrap();
        assert_eq!(body, "c3\nc4\nc5\n");
        let members = x.complete(batch).unwrap();
        assert_eq!(ids(&members), [3, 4, 5]);
        assert!(members.iter().all(|m| m.rules == 2));
    }

    #[test]
    fn without_a_limit_every_check_is_its_own_exchange() {
        let mut x = Exchanges::new(0);
        for ctx in 0..1000 {
            x.enqueue(ctx, 1, "k\n".into());
            assert!(x.take(0).is_some());
        }
    }

    #[test]
    fn a_departed_request_leaves_the_queue_with_its_line() {
        let mut x = Exchanges::new(1);
        x.enqueue(1, 1, "a\n".into());
        let first = x.take(0).unwrap().0;
        x.enqueue(2, 1, "b\n".into());
        x.enqueue(3, 1, "c\n".into());
        x.forget(2);
        x.complete(first);
        let (id, body) = x.take(0).unwrap();
        assert_eq!(body, "c\n", "line and member leave together");
        assert_eq!(ids(&x.complete(id).unwrap()), [3]);
    }

    #[test]
    fn batches_are_bounded_in_checks_and_bytes() {
        let mut x = Exchanges::new(1);
        for ctx in 0..(MAX_BATCH as u32 + 10) {
            x.enqueue(ctx, 1, "k\n".into());
        }
        let (a, _) = x.take(0).unwrap();
        assert_eq!(x.complete(a).unwrap().len(), MAX_BATCH);
        let (b, _) = x.take(0).unwrap();
        assert_eq!(x.complete(b).unwrap().len(), 10);

        let line = format!("{}\n", "k".repeat(MAX_BODY / 3));
        for ctx in 0..4 {
            x.enqueue(ctx, 1, line.clone());
        }
        let (c, body) = x.take(0).unwrap();
        assert!(body.len() <= MAX_BODY);
        assert_eq!(x.complete(c).unwrap().len(), 2);
    }

    #[test]
    fn in_one_mode_checks_and_lease_returns_leave_apart() {
        let mut x = Exchanges::new(1);
        let lines = ["a\n", "+ r\n", "+ s\n", "b\n"];
        for (ctx, line) in lines.iter().enumerate() {
            x.enqueue(ctx as u32, 1, line.to_string());
        }
        let (id, body) = x.take(0).unwrap();
        assert_eq!(body, lines.concat(), "mixed by default");
        x.complete(id);
        x.set_one_mode(true);
        for (ctx, line) in lines.iter().enumerate() {
            x.enqueue(ctx as u32, 1, line.to_string());
        }
        let mut bodies = Vec::new();
        while let Some((id, body)) = x.take(0) {
            bodies.push(body);
            x.complete(id);
        }
        assert_eq!(bodies, ["a\n", "+ r\n+ s\n", "b\n"]);
    }

    #[test]
    fn in_one_mode_an_exchange_carries_no_more_keys_than_one_script_call() {
        // 256 requests of 32 rules: 8,192 keys, which one script call cannot take (the
        // script's unpacks overflow from about 4,000), so the redis-call build splits them.
        let mut x = Exchanges::new(1);
        x.set_one_mode(true);
        for ctx in 0..256 {
            x.enqueue(ctx, 32, "k\n".into());
        }
        let mut sizes = Vec::new();
        while let Some((id, _)) = x.take(0) {
            let members = x.complete(id).unwrap();
            sizes.push(members.iter().map(|m| m.rules).sum::<usize>());
        }
        assert_eq!(sizes, vec![MAX_KEYS_PER_CALL; 8]);
    }

    #[test]
    fn late_exchanges_expire_and_a_broken_transport_abandons_all() {
        let mut x = Exchanges::new(0);
        x.enqueue(1, 1, "a\n".into());
        let old = x.take(100).unwrap().0;
        x.enqueue(2, 1, "b\n".into());
        x.take(120).unwrap();
        let expired = x.expire(125, 25);
        assert_eq!(expired.len(), 1);
        assert_eq!(ids(&expired[0]), [1]);
        assert!(x.complete(old).is_none(), "a late reply is ignored");
        x.enqueue(3, 1, "c\n".into());
        assert_eq!(ids(&x.abandon_all().concat()), [2]);
        assert_eq!(ids(&x.drain_waiting()), [3]);
        assert!(x.has_room() && !x.is_waiting());
    }
}
