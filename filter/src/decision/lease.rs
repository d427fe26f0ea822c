//! Token leases for hot buckets (`"lease": {"tokens": 100, "ttl": "1s"}` in a rule): a
//! worker that checks the same bucket again within `ttl` asks for up to `tokens` more than
//! the request's cost, and admits that bucket's next requests from them without a callout
//! until they are used or `ttl` is over; what is left then goes back to Redis.
//!
//! Leased tokens are taken from the global bucket first, so no more is ever admitted than
//! the bucket allows; the price is that tokens parked in a lease are not available to the
//! other gateways until used or returned (docs/configuration.md sizes it). One ask per bucket is out
//! at a time, so a worker never holds more than `tokens` of one bucket (plus what is left
//! of a lease that lacked one request's cost).
//!
//! What a rule's `lease` may say is `ratelimit_config::lease`; this is what a worker does
//! with one.
//!
//! A lease down to less than half its `tokens` is topped up in the background: an ask of
//! its own, for what it lacks, that no request waits for. A hot bucket's requests are then
//! all admitted from the lease, none waiting for an ask.

use hashbrown::HashMap;
use ratelimit_config::backend::MAX_TIMEOUT_MS;
use ratelimit_config::lease::LeasePolicy;
use ratelimit_config::limit::Limit;
use ratelimit_protocol::RuleResult;

/// Buckets a worker tracks for leases (held, asked for, or seen once within their ttl).
pub const MAX_ENTRIES: usize = 10_000;

/// A lease return: unused tokens going back to their bucket (a `+ ` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub key: String,
    pub limit: Limit,
    pub tokens: u64,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    tokens: u64,
    /// The lease (or the sighting, without tokens) is over then.
    expires_ms: u64,
    limit: Limit,
    /// The bucket as of the grant, less what was admitted from the lease since: shown in
    /// `X-RateLimit-Remaining`.
    remaining: u64,
    full_at_ms: u64,
    /// A check asking for a lease of this bucket is out.
    asking: bool,
}

/// What a lease gave a request (`Leases::take`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The rule's result as the request is shown it.
    pub shown: RuleResult,
    /// The lease ran low: the top-up's id and the tokens it asks for, to send with
    /// `send_top_up`. Its answer comes back with the id (`topped_up`).
    pub top_up: Option<(u32, u64)>,
}

/// A top-up that is out: whose lease it tops up, and until when its grant is held.
#[derive(Debug, Clone)]
struct TopUp {
    key: String,
    limit: Limit,
    expires_ms: u64,
}

/// One worker's leases.
#[derive(Debug, Default)]
pub struct Leases {
    held: HashMap<String, Held>,
    /// Lease returns, waiting for the next exchange.
    returns: Vec<Return>,
    /// No entry ends before then: the tick's `expire` skips the scan until it has to.
    soonest_ms: u64,
    /// Top-ups to send (their id and check line), and those out, by id.
    top_ups: Vec<(u32, String)>,
    topping: HashMap<u32, TopUp>,
    last_top_up: u32,
}

impl Leases {
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Takes `cost` from a live lease of `key` under `limit`: the rule's result as shown,
    /// and the top-up to send if that leaves the lease low (see `Taken`). One lookup: this
    /// is every hot request's path.
    pub fn take(
        &mut self,
        key: &str,
        limit: &Limit,
        cost: u64,
        policy: LeasePolicy,
        now_ms: u64,
    ) -> Option<Taken> {
        let held = self.held.get_mut(key)?;
        if held.tokens < cost || now_ms >= held.expires_ms || held.limit != *limit {
            return None;
        }
        held.tokens -= cost;
        held.remaining = held.remaining.saturating_sub(cost);
        let shown = RuleResult {
            allowed: true,
            blocked: false,
            remaining: held.remaining,
            full_ms: held.full_at_ms.saturating_sub(now_ms),
            wait_ms: 0,
            leased: 0,
            owed: 0,
            borrowed: 0,
            limit: 0,
        };
        // Less than half of `policy.tokens` left and no ask out: ask for what it lacks.
        let low = held.tokens.saturating_mul(2) < policy.tokens;
        let top_up = (low && !held.asking).then(|| {
            held.asking = true;
            let lacking = policy.tokens - held.tokens;
            let id = fresh_top_up_id(&mut self.last_top_up, &self.topping);
            let top_up = TopUp {
                key: key.to_owned(),
                limit: *limit,
                expires_ms: now_ms.saturating_add(policy.ttl_ms),
            };
            self.topping.insert(id, top_up);
            (id, lacking)
        });
        Some(Taken { shown, top_up })
    }

    /// Returns what `take` took for a request another rule refused (to Redis, if the
    /// lease is gone meanwhile).
    pub fn return_taken(&mut self, key: &str, limit: &Limit, cost: u64) {
        match self.held.get_mut(key).filter(|h| h.limit == *limit) {
            Some(held) => held.tokens += cost,
            None => self.queue_return(key, limit, cost),
        }
    }

    /// Whether a check of `key` should ask for a lease now: the worker saw it within the
    /// lease's `ttl_ms` and no other ask is out. Remembers the sighting (when there is room).
    pub fn wants(&mut self, key: &str, limit: &Limit, ttl_ms: u64, now_ms: u64) -> bool {
        if let Some(held) = self.held.get_mut(key) {
            if held.asking || now_ms >= held.expires_ms {
                return false;
            }
            held.asking = true;
            return true;
        }
        if self.held.len() < MAX_ENTRIES {
            let sighting = Held {
                tokens: 0,
                expires_ms: now_ms.saturating_add(ttl_ms),
                limit: *limit,
                remaining: 0,
                full_at_ms: now_ms,
                asking: false,
            };
            self.soonest_ms = self.soonest_ms.min(sighting.expires_ms);
            self.held.insert(key.to_owned(), sighting);
        }
        false
    }

    /// The answer to an ask for `key` came back: `result.leased` tokens (maybe none) are
    /// held until `expires_ms`. Past the burst, or without room, they go back at once.
    pub fn granted(&mut self, key: &str, limit: &Limit, result: &RuleResult, expires_ms: u64) {
        let full_at_ms = expires_ms.saturating_add(result.full_ms);
        let Some(held) = self.held.get_mut(key) else {
            if result.leased > 0 {
                self.queue_return(key, limit, result.leased);
            }
            return;
        };
        held.asking = false;
        if result.leased == 0 {
            return;
        }
        let leftover = if held.limit == *limit && held.tokens > 0 {
            held.tokens
        } else {
            0
        };
        let total = leftover + result.leased;
        let kept = total.min(limit.burst);
        self.soonest_ms = self.soonest_ms.min(expires_ms);
        *held = Held {
            tokens: kept,
            expires_ms,
            limit: *limit,
            remaining: result.remaining,
            full_at_ms,
            asking: false,
        };
        if total > kept {
            self.queue_return(key, limit, total - kept);
        }
    }

    /// Queues top-up `id`'s check line for the next exchange.
    pub fn send_top_up(&mut self, id: u32, line: String) {
        self.top_ups.push((id, line));
    }

    /// The top-ups to send now: their ids and check lines.
    pub fn take_top_ups(&mut self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.top_ups)
    }

    /// Top-up `id` came back: its grant joins the lease (`None`: it failed, nothing
    /// granted). One this worker does not know, it cannot place: see `adopt_top_ups`.
    pub fn topped_up(&mut self, id: u32, result: Option<&RuleResult>) {
        let Some(top_up) = self.topping.remove(&id) else {
            return;
        };
        match result.filter(|r| r.allowed && !r.blocked) {
            Some(result) => self.granted(&top_up.key, &top_up.limit, result, top_up.expires_ms),
            None => self.not_granted(&top_up.key),
        }
    }

    /// Takes over the top-ups `old` has out (the configuration changed and their answers
    /// come to this worker): their grants, finding no lease here, go back to Redis.
    pub fn adopt_top_ups(&mut self, old: &mut Leases) {
        self.last_top_up = self.last_top_up.max(old.last_top_up);
        self.topping.extend(old.topping.drain());
    }

    /// An ask for `key` ended without an answer (the check failed or was refused).
    pub fn not_granted(&mut self, key: &str) {
        if let Some(held) = self.held.get_mut(key) {
            held.asking = false;
        }
    }

    /// Ends the leases over at `now_ms`: their tokens are to go back.
    pub fn expire(&mut self, now_ms: u64) {
        if now_ms < self.soonest_ms {
            return;
        }
        self.end_held(now_ms);
        // A top-up whose exchange was dropped unanswered (its request went away with it).
        let mut soonest = self.soonest_ms;
        self.topping.retain(|_, t| {
            let given_up_ms = t.expires_ms.saturating_add(MAX_TIMEOUT_MS);
            let waiting = now_ms < given_up_ms;
            if waiting {
                soonest = soonest.min(given_up_ms);
            }
            waiting
        });
        self.soonest_ms = soonest;
    }

    fn end_held(&mut self, now_ms: u64) {
        let mut returns = Vec::new();
        let mut soonest = u64::MAX;
        self.held.retain(|key, held| {
            let live = now_ms < held.expires_ms;
            if live {
                soonest = soonest.min(held.expires_ms);
            }
            if !live && held.tokens > 0 {
                returns.push(Return {
                    key: key.clone(),
                    limit: held.limit,
                    tokens: held.tokens,
                });
            }
            live
        });
        self.returns.append(&mut returns);
        self.soonest_ms = soonest;
    }

    /// Ends every lease (the configuration changed): all their tokens are to go back, and
    /// no top-up not sent yet will leave.
    pub fn end_all(&mut self) {
        self.end_held(u64::MAX);
        for (id, _) in self.top_ups.drain(..) {
            self.topping.remove(&id);
        }
    }

    /// The lease returns to send now, each to its bucket.
    pub fn take_returns(&mut self) -> Vec<Return> {
        std::mem::take(&mut self.returns)
    }

    fn queue_return(&mut self, key: &str, limit: &Limit, tokens: u64) {
        self.returns.push(Return {
            key: key.to_owned(),
            limit: *limit,
            tokens,
        });
    }
}

/// An id for a new top-up that no top-up out uses.
fn fresh_top_up_id(last: &mut u32, topping: &HashMap<u32, TopUp>) -> u32 {
    loop {
        *last = last.wrapping_add(1);
        if !topping.contains_key(last) {
            return *last;
        }
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
