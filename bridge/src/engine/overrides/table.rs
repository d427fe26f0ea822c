//! The overrides in force as the bridge applies them: found by a rule's bucket key (its own
//! override, else its rule's, else for the rate limit service its domain's or leading
//! entries'), and put beside the rule's limit, which the script keeps paying.

use super::Override;
use crate::store::check::{Check, RuleSpec};
use ratelimit_config::keys::SERVICE_RULE;
use ratelimit_protocol::Overridden;
use std::collections::HashMap;

/// The overrides in force, by the key they name (a bucket key, or `<prefix>:<rule>`).
#[derive(Debug, Default)]
pub struct Table {
    by_key: HashMap<String, Override>,
}

impl Table {
    pub fn new(overrides: impl IntoIterator<Item = Override>) -> Table {
        Table {
            by_key: overrides
                .into_iter()
                .map(|o| (o.target.key.clone(), o))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The override of the bucket `key`: its own, else its rule's. A bucket key's rule is
    /// its first two segments, as prefixes and rule names hold no `:`. A bucket of the rate
    /// limit service (`<prefix>:rls:<domain>:<key>:<value>...`) has, for a rule, its domain
    /// and its descriptor's leading entries: the longest of them with an override.
    pub fn find(&self, key: &str) -> Option<&Override> {
        if let Some(own) = self.by_key.get(key) {
            return Some(own);
        }
        let mut colons = key.match_indices(':').map(|(i, _)| i);
        let rule_start = colons.next()? + 1;
        let rule_end = colons.next().unwrap_or(key.len());
        if key.get(rule_start..rule_end) != Some(SERVICE_RULE) {
            return self
                .by_key
                .get(key.get(..rule_end)?)
                .filter(|o| o.target.rule_wide());
        }
        let mut end = key.len();
        while let Some(cut) = key.get(..end)?.rfind(':').filter(|&cut| cut > rule_end) {
            if let Some(o) = self.by_key.get(key.get(..cut)?) {
                return Some(o);
            }
            end = cut;
        }
        None
    }

    /// Puts its override on every rule of `check` that has one.
    pub fn apply(&self, check: &mut Check) {
        if self.is_empty() {
            return;
        }
        for rule in check.iter_mut() {
            if let Some(o) = self.find(&rule.key) {
                overridden(rule, o);
            }
        }
    }
}

/// `rule` under the override `o`, its limit as the gateway sent it kept beside. The
/// override's bucket always holds one request's cost, which the gateway's configuration
/// guarantees and an override may not (`--burst 1` for a rule of cost 5): such a client
/// gets one request per refill of its cost.
/// On a calendar quota the override's burst is the period's quota, refilled at each
/// period's start as the rule's is, never in between.
pub fn overridden(rule: &mut RuleSpec, o: &Override) {
    let (num, den) = match rule.calendar {
        Some(_) => (0, 1),
        None => (o.limit.num, o.limit.den),
    };
    rule.overridden = Some(Overridden {
        burst: o.limit.burst.max(rule.cost),
        num,
        den,
        until_ms: o.expires_ms,
    });
}
