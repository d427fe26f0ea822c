//! The answers to a batch's script calls, gathered per check: which parts took tokens,
//! which denied, which failed, what must be given back, and at the end one outcome per
//! check. Pure bookkeeping (see `batch` for the order the calls go in).

use super::batch::{Call, Placed};
use super::commit::PartReply;
use crate::store::check::{Check, CheckOutcome, RuleOutcome};
use ratelimit_protocol::script::{Part, FOREIGN_VALUE};

/// The answers gathered so far, per check.
pub struct Tally {
    checks: Vec<CheckTally>,
}

#[derive(Default)]
struct CheckTally {
    /// Latest Redis time among the calls that answered for this check.
    now: u64,
    rules: Vec<Option<RuleOutcome>>,
    /// Each rule's capacity, reported for a rule the check never reached (see `finish`).
    capacity: Vec<u64>,
    /// Why a call carrying part of this check failed.
    failure: Option<String>,
    /// Some part's rules did not all admit.
    denied: bool,
    /// Parts whose rules all admitted, with their nodes: they took tokens.
    took: Vec<Placed>,
}

impl Tally {
    pub fn new(checks: &[Check]) -> Tally {
        Tally {
            checks: checks
                .iter()
                .map(|c| CheckTally {
                    rules: vec![None; c.len()],
                    capacity: c.iter().map(|r| r.burst).collect(),
                    ..CheckTally::default()
                })
                .collect(),
        }
    }

    /// Records the answers to a `Mode::Check` call, one per part.
    pub fn checked(&mut self, call: &Call, replies: Vec<PartReply>) {
        for (part, reply) in call.parts.iter().zip(replies) {
            let Some(t) = self.checks.get_mut(part.check) else {
                continue;
            };
            let admitted = t.record(part, reply, false);
            if !admitted {
                t.denied = true;
            } else if part.rules.len() < t.rules.len() {
                // Only a part of the check may have to give back: a part of all its rules
                // is the whole check, which nothing else can deny.
                t.took.push((call.node, part.clone()));
            }
        }
    }

    /// Records the answers to a `Mode::Peek` call: a check that a node would deny is
    /// decided now (denied, having taken nothing there), as is one whose peek failed.
    pub fn peeked(&mut self, call: &Call, replies: Vec<PartReply>) {
        for (part, reply) in call.parts.iter().zip(replies) {
            if let Some(t) = self.checks.get_mut(part.check) {
                t.denied |= !t.record(part, reply, false);
            }
        }
    }

    /// Records the answers to a `Mode::Refund` call: the rules given back report their
    /// buckets after it. A refund that failed only loses tokens until the refill.
    pub fn refunded(&mut self, call: &Call, replies: Vec<PartReply>) {
        for (part, reply) in call.parts.iter().zip(replies) {
            if let Some(t) = self.checks.get_mut(part.check) {
                t.record(part, reply, true);
            }
        }
    }

    /// Whether check `i` is decided already (something denied it or failed).
    pub fn decided(&self, i: usize) -> bool {
        self.checks
            .get(i)
            .is_some_and(|t| t.denied || t.failure.is_some())
    }

    /// Parts to give back: those that took tokens for a check something else denied or
    /// failed. They leave the tally, so a second call returns nothing.
    pub fn refunds(&mut self) -> Vec<Placed> {
        let mut refunds = Vec::new();
        for t in &mut self.checks {
            if t.denied || t.failure.is_some() {
                refunds.append(&mut t.took);
            }
        }
        refunds
    }

    /// One outcome per check, in batch order. A denied check may not have reached all its
    /// rules (a shared bucket is not taken once the client's own denied): such a rule
    /// reports its capacity, as it took nothing and would not have denied alone.
    pub fn finish(self) -> Vec<CheckOutcome> {
        self.checks
            .into_iter()
            .map(|t| {
                if let Some(e) = t.failure {
                    return Err(e);
                }
                let denied = t.denied;
                let rules: Option<Vec<RuleOutcome>> = t
                    .rules
                    .into_iter()
                    .zip(t.capacity)
                    .map(|(outcome, capacity)| match outcome {
                        None if denied => Some(RuleOutcome {
                            allowed: true,
                            blocked: false,
                            remaining: capacity,
                            full_ms: 0,
                            wait_ms: 0,
                            leased: 0,
                            owed: 0,
                            borrowed: 0,
                            limit: 0,
                        }),
                        outcome => outcome,
                    })
                    .collect();
                Ok((t.now, rules.ok_or("a node gave no result")?))
            })
            .collect()
    }
}

impl CheckTally {
    /// Records one part's reply; whether all its rules admitted. Given back (`refund`), a
    /// rule's outcome replaces the one it had only with a bucket's level, and a failure
    /// is only logged.
    fn record(&mut self, part: &Part, reply: PartReply, refund: bool) -> bool {
        let (now, outcomes) = match reply {
            Ok(answer) => answer,
            Err(e) if refund => {
                log::warn!("give-back failed, tokens lost until refill: {}", e.reason());
                return false;
            }
            Err(e) => {
                self.failure = Some(e.reason().to_string());
                return false;
            }
        };
        if !refund {
            self.now = self.now.max(now);
        }
        let mut admitted = true;
        let mut outcomes = outcomes.into_iter();
        for &r in &part.rules {
            let answered = outcomes.next();
            if answered == Some(None) && !refund {
                self.failure = Some(FOREIGN_VALUE.into());
            }
            let outcome = answered.flatten();
            admitted &= outcome.is_some_and(|o| o.allowed);
            if let Some(slot) = self.rules.get_mut(r) {
                match (refund, outcome) {
                    (true, Some(o)) => *slot = Some(o),
                    (true, None) => {}
                    (false, o) => *slot = o,
                }
            }
        }
        admitted
    }
}

#[cfg(test)]
#[path = "tally_tests.rs"]
mod tests;
