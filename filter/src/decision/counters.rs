//! The filter's counters, kept in wasm memory and handed to the host in one flush per tick:
//! a host call per request and counter would cost more than the counting is worth. Some
//! are also kept per rule, named so that the hosts can turn the rule into a label.

use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;

/// Every counter, exposed by Envoy as `wasmcustom.ratelimit.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Allowed,
    Denied,
    /// Requests denied from the worker's deny cache, without a check.
    DeniedCached,
    /// Requests refused because their client is blocked.
    Blocked,
    /// Requests admitted from the worker's leases, without a check.
    AllowedLeased,
    /// Requests admitted although a rule in shadow mode would have denied them.
    ShadowDenied,
    BackendFailures,
    ShortCircuits,
    /// Checks the bridge refused as malformed (they got the failure mode).
    Refused,
    /// Requests answered 400 for repeating an identity header.
    Rejected,
    /// Requests refused for lacking an identity a rule needs (`"missing": "deny"`).
    Missing,
    /// HTTP callouts sent to the bridge.
    Callouts,
    /// Messages sent on the gRPC stream to the bridge.
    StreamMessages,
    /// Checks sent to the bridge, over all exchanges.
    ChecksSent,
    /// Exchanges by number of checks carried: 1, 2-3, 4-7, ..., 64 and more.
    Batch1,
    Batch2To3,
    Batch4To7,
    Batch8To15,
    Batch16To31,
    Batch32To63,
    Batch64Up,
    /// Tokens metered rules' responses measured (each metered rule's).
    MeteredTokens,
    /// Metered rules whose response could not be read in full (compressed, cut short,
    /// malformed, no usage reported): charged the rule's `max` instead.
    Unmeasured,
    /// Settlements the backend applied (or found applied before, when a reply was lost).
    Settled,
    /// Tokens settlements took beyond what their buckets held: debt incurred.
    Debt,
    /// Settlements (and slot releases) given up on, after their retries: the reservation
    /// stood (the slots were held until they expired).
    SettleFailures,
    /// Requests admitted holding in-flight slots (or whose check may have taken them).
    SlotsTaken,
    /// Requests whose slots the backend released.
    SlotsReleased,
    /// Renewals of held slots sent.
    SlotRenewals,
}

impl Counter {
    pub const ALL: [Counter; 29] = [
        Counter::Allowed,
        Counter::Denied,
        Counter::DeniedCached,
        Counter::Blocked,
        Counter::AllowedLeased,
        Counter::ShadowDenied,
        Counter::BackendFailures,
        Counter::ShortCircuits,
        Counter::Refused,
        Counter::Rejected,
        Counter::Missing,
        Counter::Callouts,
        Counter::StreamMessages,
        Counter::ChecksSent,
        Counter::Batch1,
        Counter::Batch2To3,
        Counter::Batch4To7,
        Counter::Batch8To15,
        Counter::Batch16To31,
        Counter::Batch32To63,
        Counter::Batch64Up,
        Counter::MeteredTokens,
        Counter::Unmeasured,
        Counter::Settled,
        Counter::Debt,
        Counter::SettleFailures,
        Counter::SlotsTaken,
        Counter::SlotsReleased,
        Counter::SlotRenewals,
    ];

    /// The metric's name.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Allowed => "ratelimit.allowed",
            Counter::Denied => "ratelimit.denied",
            Counter::DeniedCached => "ratelimit.denied_cached",
            Counter::Blocked => "ratelimit.blocked",
            Counter::AllowedLeased => "ratelimit.allowed_leased",
            Counter::ShadowDenied => "ratelimit.shadow_denied",
            Counter::BackendFailures => "ratelimit.backend_failures",
            Counter::ShortCircuits => "ratelimit.short_circuits",
            Counter::Refused => "ratelimit.refused",
            Counter::Rejected => "ratelimit.rejected",
            Counter::Missing => "ratelimit.missing",
            Counter::Callouts => "ratelimit.callouts",
            Counter::StreamMessages => "ratelimit.stream_messages",
            Counter::ChecksSent => "ratelimit.checks_sent",
            Counter::Batch1 => "ratelimit.batch_1",
            Counter::Batch2To3 => "ratelimit.batch_2_3",
            Counter::Batch4To7 => "ratelimit.batch_4_7",
            Counter::Batch8To15 => "ratelimit.batch_8_15",
            Counter::Batch16To31 => "ratelimit.batch_16_31",
            Counter::Batch32To63 => "ratelimit.batch_32_63",
            Counter::Batch64Up => "ratelimit.batch_64_up",
            Counter::MeteredTokens => "ratelimit.metered_tokens",
            Counter::Unmeasured => "ratelimit.unmeasured",
            Counter::Settled => "ratelimit.settled",
            Counter::Debt => "ratelimit.debt",
            Counter::SettleFailures => "ratelimit.settle_failures",
            Counter::SlotsTaken => "ratelimit.slots_taken",
            Counter::SlotsReleased => "ratelimit.slots_released",
            Counter::SlotRenewals => "ratelimit.slot_renewals",
        }
    }

    /// The batch-size bucket of an exchange of `checks` checks.
    pub fn batch(checks: usize) -> Counter {
        match checks {
            0 | 1 => Counter::Batch1,
            2..=3 => Counter::Batch2To3,
            4..=7 => Counter::Batch4To7,
            8..=15 => Counter::Batch8To15,
            16..=31 => Counter::Batch16To31,
            32..=63 => Counter::Batch32To63,
            _ => Counter::Batch64Up,
        }
    }
}

/// Counts not yet handed to the host.
#[derive(Debug, Default)]
pub struct Counters {
    pending: [u64; Counter::ALL.len()],
}

impl Counters {
    pub fn add(&mut self, counter: Counter, n: u64) {
        if let Some(slot) = self.pending.get_mut(counter as usize) {
            *slot = slot.saturating_add(n);
        }
    }

    /// One exchange of `checks` checks left for the bridge.
    pub fn exchange(&mut self, http: bool, checks: usize) {
        let via = if http {
            Counter::Callouts
        } else {
            Counter::StreamMessages
        };
        self.add(via, 1);
        self.add(Counter::ChecksSent, checks as u64);
        self.add(Counter::batch(checks), 1);
    }

    /// The counts since the last drain, zero ones left out.
    pub fn drain(&mut self) -> Vec<(Counter, u64)> {
        let out = Counter::ALL
            .iter()
            .zip(self.pending.iter())
            .filter(|(_, &n)| n > 0)
            .map(|(&c, &n)| (c, n))
            .collect();
        self.pending = Default::default();
        out
    }
}

/// The counters also kept per rule, in the order of `RuleCounts`' slots.
pub const PER_RULE: [Counter; 7] = [
    Counter::Allowed,
    Counter::Denied,
    Counter::DeniedCached,
    Counter::Blocked,
    Counter::AllowedLeased,
    Counter::ShadowDenied,
    Counter::Missing,
];

/// The name of `counter`'s metric for the rule called `rule`:
/// `ratelimit.<counter>_rule=<rule>`. Rule names are letters, digits, `-`, `_` and `.`,
/// so the `=` ends the counter's name: the hosts' tag extraction (Envoy's `stats_tags`,
/// Kong's `label_patterns`) matches `_rule=(name)` at the end and makes it a label.
pub fn per_rule_name(counter: Counter, rule: &str) -> String {
    format!("{}_rule={rule}", counter.name())
}

/// Per-rule counts not yet handed to the host, by rule index (`PlannedRule::rule`) and
/// `PER_RULE` slot. A worker's counts belong to one configuration, whose rules they count.
#[derive(Debug, Default)]
pub struct RuleCounts {
    pending: Vec<[u64; PER_RULE.len()]>,
}

impl RuleCounts {
    pub fn new(rules: usize) -> RuleCounts {
        RuleCounts {
            pending: vec![[0; PER_RULE.len()]; rules],
        }
    }

    pub fn add(&mut self, rule: usize, counter: Counter) {
        let slot = PER_RULE.iter().position(|&c| c == counter);
        if let Some(n) = slot.and_then(|s| self.pending.get_mut(rule)?.get_mut(s)) {
            *n = n.saturating_add(1);
        }
    }

    /// A request the bridge answered: per rule, what it did. When the request was refused,
    /// the rules that lacked the cost denied it (or blocked its client) and the others
    /// count nothing; when admitted, each took its cost. A rule in shadow mode that lacked
    /// the cost counts a shadow denial whatever the verdict.
    pub fn answered(&mut self, planned: &[PlannedRule], results: &[RuleResult], refused: bool) {
        for (p, r) in planned.iter().zip(results) {
            let lacked = !r.allowed || (p.shadow && r.wait_ms > 0);
            let counter = match (p.shadow, lacked, refused) {
                (true, true, _) => Counter::ShadowDenied,
                (false, true, true) if r.blocked => Counter::Blocked,
                (false, true, true) => Counter::Denied,
                (_, false, false) => Counter::Allowed,
                _ => continue,
            };
            self.add(p.rule, counter);
        }
    }

    /// Rules that took the cost of an admitted request from this worker's leases.
    pub fn leased(&mut self, leased: &[PlannedRule]) {
        for p in leased {
            self.add(p.rule, Counter::AllowedLeased);
        }
    }

    /// The counts since the last drain as (rule, counter, count), zero ones left out.
    pub fn drain(&mut self) -> Vec<(usize, Counter, u64)> {
        let mut out = Vec::new();
        for (rule, counts) in self.pending.iter_mut().enumerate() {
            for (&counter, n) in PER_RULE.iter().zip(counts.iter_mut()) {
                if *n > 0 {
                    out.push((rule, counter, std::mem::take(n)));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::planned;

    #[test]
    fn counts_accumulate_until_drained() {
        let mut c = Counters::default();
        c.add(Counter::Allowed, 1);
        c.add(Counter::Allowed, 2);
        c.exchange(false, 5);
        c.exchange(true, 1);
        assert_eq!(
            c.drain(),
            [
                (Counter::Allowed, 3),
                (Counter::Callouts, 1),
                (Counter::StreamMessages, 1),
                (Counter::ChecksSent, 6),
                (Counter::Batch1, 1),
                (Counter::Batch4To7, 1),
            ]
        );
        assert!(c.drain().is_empty());
    }

    #[test]
    fn batch_sizes_fall_in_power_of_two_buckets() {
        let cases = [
            (1, Counter::Batch1),
            (3, Counter::Batch2To3),
            (4, Counter::Batch4To7),
            (15, Counter::Batch8To15),
            (16, Counter::Batch16To31),
            (63, Counter::Batch32To63),
            (64, Counter::Batch64Up),
            (256, Counter::Batch64Up),
        ];
        for (n, counter) in cases {
            assert_eq!(Counter::batch(n), counter, "{n}");
        }
        let names: std::collections::HashSet<_> = Counter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), Counter::ALL.len());
        assert!(Counter::ALL
            .iter()
            .enumerate()
            .all(|(i, &c)| c as usize == i));
    }
    /// Rule `rule` (bucket `rl:<rule>`, one request a second), `shadow` or enforced.
    fn rule_planned(rule: usize, shadow: bool) -> PlannedRule {
        PlannedRule {
            rule,
            shadow,
            ..planned(&format!("rl:{rule}"), 1, 1, 1_000, 1)
        }
    }

    fn result(allowed: bool, blocked: bool, wait_ms: u64) -> RuleResult {
        RuleResult {
            allowed,
            blocked,
            wait_ms,
            ..RuleResult::default()
        }
    }

    #[test]
    fn each_rule_counts_what_it_did_to_the_request() {
        let mut counts = RuleCounts::new(4);
        let rules = [
            rule_planned(0, false),
            rule_planned(1, false),
            rule_planned(2, true),
            rule_planned(3, false),
        ];
        // Refused: rule 0 lacked the cost, rule 1 blocked, the shadow rule 2 lacked it,
        // rule 3 had it (and counts nothing, having taken nothing).
        let refused = [
            result(false, false, 5),
            result(false, true, 9),
            result(true, false, 3),
            result(true, false, 0),
        ];
        counts.answered(&rules, &refused, true);
        // Admitted: every enforced rule took its cost; the shadow rule had it this time.
        let admitted = [result(true, false, 0); 4];
        counts.answered(&rules, &admitted, false);
        counts.leased(&rules[3..]);
        counts.add(0, Counter::DeniedCached);
        counts.add(9, Counter::Allowed); // no such rule: ignored
        counts.add(0, Counter::Callouts); // not a per-rule counter: ignored
        assert_eq!(
            counts.drain(),
            [
                (0, Counter::Allowed, 1),
                (0, Counter::Denied, 1),
                (0, Counter::DeniedCached, 1),
                (1, Counter::Allowed, 1),
                (1, Counter::Blocked, 1),
                (2, Counter::Allowed, 1),
                (2, Counter::ShadowDenied, 1),
                (3, Counter::Allowed, 1),
                (3, Counter::AllowedLeased, 1),
            ]
        );
        assert!(counts.drain().is_empty());
        assert_eq!(
            per_rule_name(Counter::DeniedCached, "login.v1"),
            "ratelimit.denied_cached_rule=login.v1"
        );
    }
}
