//! How a batch of checks becomes script calls, and how their answers become one outcome
//! per check. Pure bookkeeping, apart from the connections so it can be tested alone.
//!
//! On a single server the whole batch is one call (a few if it is very large). In a Redis
//! Cluster a check's rules usually hash to different slots, and one call may only touch
//! one slot: each slot gets one call holding every check's rules of that slot, in batch
//! order. A check spanning several slots is then admitted only if every slot admitted its
//! part; otherwise the parts that did take tokens are refunded.

use crate::script::{self, Part, ScriptOutcome, Shape};
use crate::slot::slot;
use crate::wire::{Check, CheckOutcome, RuleOutcome};
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

/// Why a check that names a key holding a foreign value fails.
pub const FOREIGN_VALUE: &str =
    "a bucket key holds a value the limiter did not write; it is left untouched";

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
            Err(e) => {
                for part in &call.parts {
                    if let Some(t) = self.checks.get_mut(part.check) {
                        t.failure = Some(e.clone());
                    }
                }
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
mod tests {
    use super::*;
    use crate::wire::RuleSpec;

    fn rule(key: &str) -> RuleSpec {
        RuleSpec {
            key: key.into(),
            burst: 1,
            num: 1,
            den: 1,
            cost: 1,
        }
    }

    fn outcome(allowed: bool) -> ScriptOutcome {
        Some(RuleOutcome {
            allowed,
            remaining: 0,
            full_ms: 1,
            wait_ms: u64::from(!allowed),
        })
    }

    #[test]
    fn a_single_server_gets_the_whole_batch_in_one_call() {
        let checks = vec![vec![rule("a"), rule("b")], vec![], vec![rule("a")]];
        let calls = plan(&checks, false);
        assert_eq!(calls.len(), 1);
        let shape: Vec<(usize, Vec<usize>)> = calls[0]
            .parts
            .iter()
            .map(|p| (p.check, p.rules.clone()))
            .collect();
        assert_eq!(shape, [(0, vec![0, 1]), (1, vec![]), (2, vec![0])]);
    }

    #[test]
    fn large_batches_are_cut_between_checks() {
        let checks: Vec<Check> = (0..MAX_KEYS_PER_CALL)
            .map(|i| vec![rule(&format!("{i}a")), rule(&format!("{i}b"))])
            .collect();
        let calls = plan(&checks, false);
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|c| c.rules() == MAX_KEYS_PER_CALL));
        assert_eq!(calls[1].parts[0].check, MAX_KEYS_PER_CALL / 2);
    }

    #[test]
    fn a_call_names_at_most_255_shapes_and_an_oversized_check_goes_alone() {
        let shaped = |i: u64| RuleSpec {
            burst: 1 + i,
            ..rule(&format!("s{i}"))
        };
        let mut checks: Vec<Check> = (0..300).map(|i| vec![shaped(i)]).collect();
        checks.push((0..300).map(|i| rule(&format!("big{i}"))).collect());
        checks.push(vec![rule("after")]);
        let calls = plan(&checks, false);
        let sizes: Vec<usize> = calls.iter().map(|c| c.parts.len()).collect();
        assert_eq!(sizes, [255, 45, 1, 1]);
        assert_eq!(calls[2].parts[0].check, 300);
    }

    #[test]
    fn a_cluster_gets_one_call_per_slot_in_batch_order() {
        // {x} and {y} are different slots; a check with rules in both has two parts.
        let checks = vec![
            vec![rule("{x}1"), rule("{y}1")],
            vec![rule("{y}2")],
            vec![rule("{x}3"), rule("{x}4")],
        ];
        let calls = plan(&checks, true);
        assert_eq!(calls.len(), 2);
        for call in &calls {
            let slots: Vec<u16> = call
                .parts
                .iter()
                .flat_map(|p| {
                    p.rules
                        .iter()
                        .map(|&r| slot(checks[p.check][r].key.as_bytes()))
                })
                .collect();
            assert!(slots.windows(2).all(|w| w[0] == w[1]), "{call:?}");
            assert!(call.parts.windows(2).all(|w| w[0].check < w[1].check));
        }
        assert_eq!(calls.iter().map(Call::rules).sum::<usize>(), 5);
    }

    #[test]
    fn a_check_denied_in_one_slot_refunds_the_others() {
        let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{x}2")]];
        let calls = plan(&checks, true);
        let mut tally = Tally::new(&checks);
        for call in &calls {
            // {y} denies; {x} admits everything.
            let y = call.parts[0]
                .rules
                .iter()
                .any(|&r| checks[call.parts[0].check][r].key.starts_with("{y}"));
            let n = call.rules();
            tally.checked(call, Ok((7, vec![outcome(!y); n])));
        }
        let refunds = tally.refunds();
        assert_eq!(
            refunds,
            [Part {
                check: 0,
                rules: vec![0]
            }]
        );
        assert!(tally.refunds().is_empty(), "refunded once");
        let refund_calls = group(&checks, refunds, true);
        assert_eq!(refund_calls.len(), 1);
        tally.refunded(&refund_calls[0], Ok((8, vec![outcome(true)])));
        let out = tally.finish();
        let (now, rules) = out[0].clone().unwrap();
        assert_eq!(now, 7);
        assert!(rules[0].allowed && !rules[1].allowed);
        assert!(out[1].as_ref().unwrap().1[0].allowed);
    }

    #[test]
    fn a_failed_call_fails_its_checks_and_refunds_their_other_parts() {
        let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{x}2")]];
        let calls = plan(&checks, true);
        let mut tally = Tally::new(&checks);
        for call in &calls {
            let y = checks[call.parts[0].check][call.parts[0].rules[0]]
                .key
                .starts_with("{y}");
            let reply = if y {
                Err("down".to_string())
            } else {
                Ok((7, vec![outcome(true); call.rules()]))
            };
            tally.checked(call, reply);
        }
        assert_eq!(tally.refunds().len(), 1);
        let out = tally.finish();
        assert_eq!(out[0], Err("down".into()));
        assert!(out[1].is_ok());
    }

    #[test]
    fn a_foreign_value_fails_its_check_and_refunds_its_other_parts() {
        let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{y}2")]];
        let calls = plan(&checks, true);
        let mut tally = Tally::new(&checks);
        for call in &calls {
            let y = checks[call.parts[0].check][call.parts[0].rules[0]]
                .key
                .starts_with("{y}");
            // On y's node, the first check's key holds a foreign value.
            let outcomes = call
                .parts
                .iter()
                .map(|p| {
                    if y && p.check == 0 {
                        None
                    } else {
                        outcome(true)
                    }
                })
                .collect();
            tally.checked(call, Ok((7, outcomes)));
        }
        assert_eq!(tally.refunds().len(), 1, "x's part gives its token back");
        let out = tally.finish();
        assert_eq!(out[0], Err(FOREIGN_VALUE.into()));
        assert!(out[1].is_ok());
    }
}
