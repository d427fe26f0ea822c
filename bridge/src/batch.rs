//! How a batch of checks becomes script calls, and how their answers become one outcome
//! per check. Pure bookkeeping, apart from the connections so it can be tested alone.
//!
//! On a single server the whole batch is one call (a few if it is very large). In a Redis
//! Cluster a check's rules usually hash to different slots, and one call may only touch
//! one slot: each slot gets one call holding every check's rules of that slot, in batch
//! order. A check spanning several slots first peeks at each of its slots (a call that
//! takes nothing) and is sent to take only if every slot would admit it, so a check that
//! one slot denies never drains the buckets it shares with others elsewhere. Between peek
//! and take another gateway may still take the last token: the parts that did take are
//! then refunded.

use crate::check::{Check, CheckOutcome, RuleOutcome, RuleSpec};
use crate::script::{self, Part, ScriptOutcome, Shape};
use crate::slot::slot;
pub use ratelimit_protocol::script::FOREIGN_VALUE;
use std::collections::{BTreeMap, HashSet};

/// Most keys one script call carries: bounds the script's `unpack` (Lua's C stack holds
/// about 8000 values) and the time one call holds the server.
pub const MAX_KEYS_PER_CALL: usize = 1024;
/// Most parts one call carries: with the keys, bounds the layout string the script
/// unpacks (a byte per part and per rule).
pub const MAX_PARTS_PER_CALL: usize = 1024;

/// The work of one script call: parts of checks, in batch order, all in one slot when
/// clustered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    pub parts: Vec<Part>,
}

impl Call {
    /// Rules (= keys) the call carries.
    pub fn rules(&self) -> usize {
        self.parts.iter().map(|p| p.rules.len()).sum()
    }
}

/// Splits a batch into script calls: one per slot in a cluster (`clustered`), else one for
/// everything; either split further where one call would grow too large. A part is never
/// split, so each part stays all-or-nothing. A check without rules rides along in slot 0's
/// call (or a call of its own) only to learn the Redis time.
pub fn plan(checks: &[Check], clustered: bool) -> Vec<Call> {
    let mut parts = Vec::with_capacity(checks.len());
    for (i, check) in checks.iter().enumerate() {
        if !clustered || check.len() < 2 {
            parts.push(Part {
                check: i,
                rules: (0..check.len()).collect(),
            });
            continue;
        }
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (r, rule) in check.iter().enumerate() {
            by_slot
                .entry(slot(rule.key.as_bytes()))
                .or_default()
                .push(r);
        }
        parts.extend(by_slot.into_values().map(|rules| Part { check: i, rules }));
    }
    group(checks, parts, clustered)
}

/// Which checks went to more than one call (`checks` in all): in a cluster they peek at
/// every slot before any slot takes.
pub fn spanning(checks: usize, calls: &[Call]) -> Vec<bool> {
    let mut seen_in: Vec<Option<usize>> = vec![None; checks];
    let mut spanning = vec![false; checks];
    for (c, call) in calls.iter().enumerate() {
        for part in &call.parts {
            match seen_in.get_mut(part.check) {
                Some(Some(first)) if *first != c => {
                    if let Some(s) = spanning.get_mut(part.check) {
                        *s = true;
                    }
                }
                Some(slot) => *slot = Some(c),
                None => {}
            }
        }
    }
    spanning
}

/// `checks` with no lease asked by those `spanning` selects.
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

/// `calls` with only the parts of the checks `keep` selects; calls left empty drop out.
pub fn only(calls: &[Call], keep: impl Fn(usize) -> bool) -> Vec<Call> {
    calls
        .iter()
        .map(|call| Call {
            parts: call
                .parts
                .iter()
                .filter(|p| keep(p.check))
                .cloned()
                .collect(),
        })
        .filter(|call| !call.parts.is_empty())
        .collect()
}

/// Puts `parts` (in batch order) into calls: by slot when `clustered`, within the bounds
/// of one call (keys, parts, shapes; see `Open::full_for`).
pub fn group(checks: &[Check], parts: Vec<Part>, clustered: bool) -> Vec<Call> {
    let mut by_slot: BTreeMap<u16, Vec<Part>> = BTreeMap::new();
    for part in parts {
        let first_key = checks
            .get(part.check)
            .and_then(|c| part.rules.first().and_then(|&r| c.get(r)));
        let group = match first_key {
            Some(rule) if clustered => slot(rule.key.as_bytes()),
            _ => 0,
        };
        by_slot.entry(group).or_default().push(part);
    }
    let mut calls = Vec::new();
    for parts in by_slot.into_values() {
        let mut open = Open::default();
        for part in parts {
            let shapes: HashSet<Shape> = script::part_rules(checks, &part)
                .map(script::shape)
                .collect();
            if open.full_for(&part, &shapes) {
                calls.push(std::mem::take(&mut open).call);
            }
            open.keys += part.rules.len();
            open.shapes.extend(shapes);
            open.call.parts.push(part);
        }
        if !open.call.parts.is_empty() {
            calls.push(open.call);
        }
    }
    calls
}

/// A call being filled, with what bounds it.
#[derive(Default)]
struct Open {
    call: Call,
    keys: usize,
    shapes: HashSet<Shape>,
}

impl Open {
    /// Whether `part` (with `shapes`) must go to the next call instead. A part over the
    /// script's limits goes alone, to fail alone.
    fn full_for(&self, part: &Part, shapes: &HashSet<Shape>) -> bool {
        let Some(last) = self.call.parts.last() else {
            return false;
        };
        self.keys + part.rules.len() > MAX_KEYS_PER_CALL
            || self.call.parts.len() >= MAX_PARTS_PER_CALL
            || self.shapes.len() + shapes.difference(&self.shapes).count() > script::MAX_SHAPES
            || part.rules.len() > script::MAX_PART_RULES
            || last.rules.len() > script::MAX_PART_RULES
    }
}

/// What a script call answered: Redis time and the outcome of each of its rules in order.
pub type Reply = Result<(u64, Vec<ScriptOutcome>), String>;

/// The answers gathered so far, per check.
pub struct Tally {
    checks: Vec<CheckTally>,
}

#[derive(Default)]
struct CheckTally {
    /// Latest Redis time among the calls that answered for this check.
    now: u64,
    rules: Vec<Option<RuleOutcome>>,
    /// Why a call carrying part of this check failed.
    failure: Option<String>,
    /// Some part's rules did not all admit.
    denied: bool,
    /// Parts whose rules all admitted: they took tokens.
    took: Vec<Part>,
}

impl Tally {
    pub fn new(checks: &[Check]) -> Tally {
        Tally {
            checks: checks
                .iter()
                .map(|c| CheckTally {
                    rules: vec![None; c.len()],
                    ..CheckTally::default()
                })
                .collect(),
        }
    }

    /// Records the answer to a `Mode::Check` call.
    pub fn checked(&mut self, call: &Call, reply: Reply) {
        match reply {
            Ok((now, outcomes)) => {
                let mut outcomes = outcomes.into_iter();
                for part in &call.parts {
                    let Some(t) = self.checks.get_mut(part.check) else {
                        continue;
                    };
                    t.now = t.now.max(now);
                    let mut admitted = true;
                    for &r in &part.rules {
                        let answered = outcomes.next();
                        if answered == Some(None) {
                            t.failure = Some(FOREIGN_VALUE.into());
                        }
                        let outcome = answered.flatten();
                        admitted &= outcome.is_some_and(|o| o.allowed);
                        if let Some(slot) = t.rules.get_mut(r) {
                            *slot = outcome;
                        }
                    }
                    if admitted {
                        t.took.push(part.clone());
                    } else {
                        t.denied = true;
                    }
                }
            }
            Err(e) => self.failed(call, e),
        }
    }

    /// Records the answer to a `Mode::Peek` call: a check that a slot would deny is
    /// decided now (denied, having taken nothing anywhere), as is one whose peek failed.
    pub fn peeked(&mut self, call: &Call, reply: Reply) {
        let (now, outcomes) = match reply {
            Ok(answer) => answer,
            Err(reason) => return self.failed(call, reason),
        };
        let mut outcomes = outcomes.into_iter();
        for part in &call.parts {
            let Some(t) = self.checks.get_mut(part.check) else {
                continue;
            };
            t.now = t.now.max(now);
            for &r in &part.rules {
                let answered = outcomes.next();
                if answered == Some(None) {
                    t.failure = Some(FOREIGN_VALUE.into());
                }
                let outcome = answered.flatten();
                t.denied |= !outcome.is_some_and(|o| o.allowed);
                if let Some(slot) = t.rules.get_mut(r) {
                    *slot = outcome;
                }
            }
        }
    }

    /// Whether check `i` is decided already (a peek found it denied or failing).
    pub fn decided(&self, i: usize) -> bool {
        self.checks
            .get(i)
            .is_some_and(|t| t.denied || t.failure.is_some())
    }

    fn failed(&mut self, call: &Call, reason: String) {
        for part in &call.parts {
            if let Some(t) = self.checks.get_mut(part.check) {
                t.failure = Some(reason.clone());
            }
        }
    }

    /// Parts to give back: those that took tokens for a check another part denied or
    /// failed. They leave the tally, so a second call returns nothing.
    pub fn refunds(&mut self) -> Vec<Part> {
        let mut refunds = Vec::new();
        for t in &mut self.checks {
            if t.denied || t.failure.is_some() {
                refunds.append(&mut t.took);
            }
        }
        refunds
    }

    /// Records the answer to a `Mode::Refund` call: the refunded rules report their
    /// buckets after the refund.
    pub fn refunded(&mut self, call: &Call, reply: Reply) {
        match reply {
            Ok((_, outcomes)) => {
                let mut outcomes = outcomes.into_iter();
                for part in &call.parts {
                    for &r in &part.rules {
                        let outcome = outcomes.next().flatten();
                        let slot = self
                            .checks
                            .get_mut(part.check)
                            .and_then(|t| t.rules.get_mut(r));
                        if let (Some(slot), Some(o)) = (slot, outcome) {
                            *slot = Some(o);
                        }
                    }
                }
            }
            Err(e) => log::warn!("refund failed, tokens lost until refill: {e}"),
        }
    }

    /// One outcome per check, in batch order.
    pub fn finish(self) -> Vec<CheckOutcome> {
        self.checks
            .into_iter()
            .map(|t| {
                if let Some(e) = t.failure {
                    return Err(e);
                }
                let rules: Option<Vec<RuleOutcome>> = t.rules.into_iter().collect();
                Ok((t.now, rules.ok_or("a slot gave no result")?))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
