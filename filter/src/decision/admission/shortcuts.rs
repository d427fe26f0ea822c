//! What a worker decides about a request without the bridge: the deny cache's refusals,
//! and the rules admitted from its leases; and what it learns for them from the bridge's
//! answers.

use super::{Admission, Outcome, Verdict, Worker};
use crate::decision::counters::Counter;
use crate::decision::deny_cache::{self, DenyCache, Reason};
use crate::decision::lease::Leases;
use crate::decision::response::{self, LocalReply, Shown};
use crate::request::rules::PlannedRule;
use crate::wire::{self, RuleResult, RuleSpecRef};
use ratelimit_config::config::Config;

impl Admission {
    /// The reply the deny cache knows for this request, if any of its buckets is known to
    /// lack its cost now or its client is blocked: a block first, then the longest wait.
    pub(super) fn cached(
        &mut self,
        config: &Config,
        worker: &mut Worker,
        now_ms: u64,
    ) -> Option<Verdict> {
        let cache = &worker.deny_cache;
        let (planned, entry) = self
            .planned
            .iter()
            .filter_map(|p| Some((p, cache.lookup(&p.key, &p.limit, p.cost, now_ms)?)))
            .max_by_key(|(_, e)| (e.reason == Reason::Blocked, e.ends_ms))?;
        let blocked = entry.reason == Reason::Blocked;
        let counter = match blocked {
            true => Counter::Blocked,
            false => Counter::DeniedCached,
        };
        worker.rule_counts.add(planned.rule, counter);
        let result = RuleResult {
            allowed: false,
            blocked,
            remaining: 0,
            full_ms: entry.full_ms.saturating_sub(now_ms),
            wait_ms: entry.ends_ms.saturating_sub(now_ms),
            leased: 0,
            owed: 0,
            borrowed: 0,
            limit: entry.in_force,
        };
        self.outcome = Some(if blocked {
            Outcome::Blocked
        } else {
            Outcome::DeniedCached
        });
        let shown = Shown {
            rule: planned,
            all: &self.planned,
            result: &result,
            now_ms,
        };
        Some(Verdict::Reply(denial(config, &shown)))
    }

    /// Remembers the buckets that lack this check's cost for as long as the bridge says,
    /// and the blocked clients for a second at most (`deny_cache::BLOCK_TRUST_MS`). Not a
    /// plain denial by a rule that blocks: each of those must reach Redis to be counted
    /// towards the block.
    pub(super) fn remember_denials(
        &self,
        cache: &mut DenyCache,
        rules: &[RuleResult],
        now_ms: u64,
    ) {
        for (planned, result) in self.planned.iter().zip(rules) {
            let counted = planned.block.is_some() && !result.blocked;
            if result.allowed || result.wait_ms == 0 || counted || planned.shadow {
                continue;
            }
            let reason = if result.blocked {
                Reason::Blocked
            } else {
                Reason::Empty { cost: planned.cost }
            };
            let entry = deny_cache::Entry::new(
                reason,
                self.asked_ms,
                result.wait_ms,
                result.full_ms,
                planned.limit,
            )
            .in_force(result.limit, self.asked_ms);
            cache.insert(&planned.key, entry, now_ms);
        }
    }

    /// Whether a rule in shadow mode would have denied this admitted request; logged
    /// once a second at most per worker.
    pub(super) fn shadow_denied(
        &self,
        config: &Config,
        worker: &mut Worker,
        rules: &[RuleResult],
        now_ms: u64,
    ) -> bool {
        let Some(planned) = self
            .planned
            .iter()
            .zip(rules)
            .find(|(p, r)| p.shadow && (!r.allowed || r.wait_ms > 0))
            .map(|(p, _)| p)
        else {
            return false;
        };
        if now_ms >= worker.shadow_logged_ms.saturating_add(1_000) {
            worker.shadow_logged_ms = now_ms;
            let name = config.rule_name(planned.rule);
            log::info!("shadow: rule {name} would have denied {}", planned.key);
        }
        true
    }

    /// Admits from this worker's leases the rules that have one holding the cost (topping
    /// up a lease running low); marks the others of a leasing rule seen often enough to ask
    /// for a lease.
    pub(super) fn use_leases(&mut self, config: &Config, leases: &mut Leases, now_ms: u64) {
        let mut kept = 0;
        for i in 0..self.planned.len() {
            let Some(p) = self.planned.get_mut(i) else {
                break;
            };
            let Some(policy) = config.rules.get(p.rule).and_then(|r| r.lease) else {
                keep(&mut self.planned, &mut kept, i);
                continue;
            };
            let Some(taken) = leases.take(&p.key, &p.limit, p.cost, policy, now_ms) else {
                if leases.wants(&p.key, &p.limit, policy.ttl_ms, now_ms) {
                    p.lease = policy.tokens.min(p.limit.burst);
                }
                keep(&mut self.planned, &mut kept, i);
                continue;
            };
            if let Some((id, tokens)) = taken.top_up {
                // The bucket's rule asking for a lease alone: `0+tokens`.
                let ask = RuleSpecRef {
                    cost: 0,
                    lease: tokens,
                    ..p.spec_ref(config)
                };
                let mut line = String::with_capacity(64);
                wire::encode_check(&mut line, [ask]);
                leases.send_top_up(id, line);
            }
            self.leased_shown.push(taken.shown);
        }
        // The rules admitted from leases are now the tail, in their order (a hot request's
        // are all of them, and move over whole, without an allocation).
        if kept == 0 {
            self.leased = std::mem::take(&mut self.planned);
        } else {
            self.leased = self.planned.split_off(kept);
        }
    }

    /// Once the verdict is known: a refused request returns what it took from leases
    /// (`Leases::return_taken`); the leases asked for are held (an admitted check's grant) or asked again later.
    pub(super) fn update_leases(
        &mut self,
        config: &Config,
        leases: &mut Leases,
        verdict: &Verdict,
        answered: Option<&[RuleResult]>,
    ) {
        let admitted = matches!(verdict, Verdict::Resume);
        if !admitted {
            self.leased_shown.clear();
            for p in self.leased.drain(..) {
                leases.return_taken(&p.key, &p.limit, p.cost);
            }
        }
        for (i, p) in self.planned.iter().enumerate().filter(|(_, p)| p.lease > 0) {
            let ttl_ms = config
                .rules
                .get(p.rule)
                .and_then(|r| r.lease)
                .map(|l| l.ttl_ms);
            let grant = answered.and_then(|r| r.get(i)).filter(|_| admitted);
            match (grant, ttl_ms) {
                (Some(result), Some(ttl_ms)) => {
                    let expires_ms = self.asked_ms.saturating_add(ttl_ms);
                    leases.granted(&p.key, &p.limit, result, expires_ms);
                }
                _ => leases.not_granted(&p.key),
            }
        }
    }
}

/// Moves `planned[i]`, to be sent, right after the `kept` already to be sent, ahead of
/// those admitted from leases between them, keeping both in their order.
fn keep(planned: &mut [PlannedRule], kept: &mut usize, i: usize) {
    if let Some(between) = planned.get_mut(*kept..=i) {
        between.rotate_right(1);
    }
    *kept += 1;
}

/// The reply to a denied request, showing its rule: blocked, or over the limit.
pub(super) fn denial(config: &Config, shown: &Shown<'_>) -> LocalReply {
    let block = config.rules.get(shown.rule.rule).and_then(|r| r.block);
    match block.filter(|_| shown.result.blocked) {
        Some(block) => response::blocked(shown, block.status, config),
        None => response::too_many_requests(shown, config),
    }
}
