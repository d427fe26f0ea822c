//! The plans this bridge applies: every plan of every prefix, by bucket key, kept in memory
//! and changed in place as the log says (`registry::refresh`), so that a change costs its
//! own entry, never a copy of a hundred thousand. An entry is its key, its limit and its
//! plan's name, shared by every client of the plan: a hundred thousand plans are some
//! 25 MB of a bridge's memory (bench/plans.py).

use super::Plan;
use crate::store::check::RuleSpec;
use ratelimit_config::limit::Limit;
use ratelimit_protocol::MAX_EXACT;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};

/// A client's plan as the table keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InForce {
    pub name: Arc<str>,
    pub limit: Limit,
}

impl InForce {
    /// `plan`'s bucket key and what the table keeps of it.
    pub fn of(plan: Plan) -> (Box<str>, InForce) {
        let entry = InForce {
            name: plan.name,
            limit: plan.limit,
        };
        (plan.target.key.into_boxed_str(), entry)
    }
}

#[derive(Debug, Default)]
struct Plans {
    by_key: HashMap<Box<str>, InForce>,
    /// Each plan name once.
    names: HashSet<Arc<str>>,
}

/// The plans in force, by the bucket key they name.
#[derive(Debug, Default)]
pub struct PlanTable {
    plans: RwLock<Plans>,
}

impl PlanTable {
    pub fn len(&self) -> usize {
        self.read(|plans| plans.by_key.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` over the plans.
    fn read<T>(&self, f: impl FnOnce(&Plans) -> T) -> T {
        f(&self.plans.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Applies `changes` (a key and its plan, `None`: removed) and, first, when `whole` is
    /// given, drops the plans of those prefixes (a prefix read again in full).
    pub fn update(
        &self,
        whole: &[&str],
        changes: impl IntoIterator<Item = (Box<str>, Option<InForce>)>,
    ) {
        let mut plans = self.plans.write().unwrap_or_else(PoisonError::into_inner);
        let Plans { by_key, names } = &mut *plans;
        if !whole.is_empty() {
            by_key.retain(|key, _| !whole.iter().any(|p| under(key, p)));
        }
        for (key, plan) in changes {
            match plan {
                Some(mut plan) => {
                    match names.get(&*plan.name) {
                        Some(name) => plan.name = name.clone(),
                        None => {
                            names.insert(plan.name.clone());
                        }
                    }
                    by_key.insert(key, plan)
                }
                None => by_key.remove(&key),
            };
        }
    }

    /// The plan of bucket `key`, if its client has one.
    pub fn find(&self, key: &str) -> Option<InForce> {
        self.read(|plans| plans.by_key.get(key).cloned())
    }

    /// Puts each rule's client's plan on it: the plan's size and rate for the bucket's
    /// (a calendar quota's quota, an in-flight rule's most slots), its name for the
    /// metrics. The bucket holds one request's cost however small the plan (as an
    /// override's does), and a lease asks no more than it holds. A global rule keeps its
    /// limit (its ledger holds one budget for every region), and so does a plan whose size
    /// with the rule's debt would pass the script's exact range.
    pub fn apply(&self, rules: &mut [RuleSpec]) {
        let plans = self.plans.read().unwrap_or_else(PoisonError::into_inner);
        if plans.by_key.is_empty() {
            return;
        }
        for rule in rules.iter_mut() {
            if let Some(plan) = plans.by_key.get(rule.key.as_str()) {
                put(rule, plan);
            }
        }
    }
}

/// `rule` under its client's `plan` (`PlanTable::apply` says how), the table's or one read
/// alone (an operator's `usage`).
pub fn put(rule: &mut RuleSpec, plan: &InForce) {
    if rule.global.is_some() {
        return;
    }
    let l = &plan.limit;
    let (burst, num, den) = match (&rule.calendar, &rule.slot) {
        (None, None) => (l.burst, l.num, l.den),
        // The period's quota, or the most slots: the rule's rate stays.
        _ => (l.requests, rule.num, rule.den),
    };
    let burst = burst.max(rule.cost);
    let debt = rule.settle.as_ref().map_or(0, |s| s.debt);
    let span = u128::from(burst.saturating_add(debt)) * u128::from(den);
    if span < u128::from(MAX_EXACT) {
        (rule.burst, rule.num, rule.den) = (burst, num, den);
        rule.lease = rule.lease.min(burst);
        rule.plan = Some(plan.name.clone());
    }
}

/// Whether `key` lies under `prefix` (`prefix:...`).
fn under(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::overrides::Target;
    use ratelimit_protocol::calendar::{Calendar, Period};

    fn plan(
        key_values: &[&str],
        name: &str,
        requests: u64,
        per: &str,
    ) -> (Box<str>, Option<InForce>) {
        let values: Vec<String> = key_values.iter().map(|v| v.to_string()).collect();
        let target = Target::new("rl", "chat", &values).unwrap_or_else(|e| unreachable!("{e}"));
        let plan =
            Plan::new(target, name, requests, per, None).unwrap_or_else(|e| unreachable!("{e}"));
        let (key, entry) = InForce::of(plan);
        (key, Some(entry))
    }

    #[test]
    fn a_clients_plan_replaces_the_limit_its_gateway_sent_and_names_it() {
        let table = PlanTable::default();
        table.update(&[], [plan(&["alice"], "pro", 1000, "1m")]);
        let mut rules = vec![
            RuleSpec::plain("rl:chat:alice", 10, 1, 6000, 1),
            RuleSpec::plain("rl:chat:bob", 10, 1, 6000, 1),
        ];
        table.apply(&mut rules);
        assert_eq!((rules[0].burst, rules[0].num, rules[0].den), (1000, 1, 60));
        assert_eq!(rules[0].plan.as_deref(), Some("pro"));
        assert_eq!((rules[1].burst, rules[1].plan.as_deref()), (10, None));
        table.update(&[], [("rl:chat:alice".into(), None)]);
        let mut again = vec![RuleSpec::plain("rl:chat:alice", 10, 1, 6000, 1)];
        table.apply(&mut again);
        assert_eq!((again[0].burst, again[0].plan.as_deref()), (10, None));
    }

    #[test]
    fn a_quota_takes_the_plans_requests_and_a_small_plan_still_holds_one_request() {
        let table = PlanTable::default();
        table.update(
            &[],
            [
                plan(&["alice"], "pro", 5000, "1m"),
                plan(&["bob"], "tiny", 2, "1m"),
            ],
        );
        let monthly = RuleSpec {
            calendar: Some(Calendar {
                period: Period::Month,
                zone: "UTC".into(),
            }),
            ..RuleSpec::plain("rl:chat:alice", 100, 0, 1, 1)
        };
        let costly = RuleSpec {
            lease: 8,
            ..RuleSpec::plain("rl:chat:bob", 10, 1, 6000, 5)
        };
        let mut rules = vec![monthly, costly];
        table.apply(&mut rules);
        assert_eq!((rules[0].burst, rules[0].num, rules[0].den), (5000, 0, 1));
        // A plan of 2 still holds one request of 5, and the lease asked shrinks to it.
        let bob = &rules[1];
        assert_eq!(
            (bob.burst, bob.lease, bob.plan.as_deref()),
            (5, 5, Some("tiny"))
        );
    }

    #[test]
    fn reading_a_prefix_again_drops_its_plans_that_are_gone() {
        let table = PlanTable::default();
        table.update(
            &[],
            [
                plan(&["alice"], "pro", 1000, "1m"),
                plan(&["bob"], "pro", 1000, "1m"),
            ],
        );
        table.update(&["rl"], [plan(&["bob"], "pro", 1000, "1m")]);
        assert_eq!(table.len(), 1);
        assert!(table.find("rl:chat:alice").is_none());
    }
}
