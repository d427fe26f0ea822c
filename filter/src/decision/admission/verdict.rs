//! The verdict on a check's results: denied when a rule not in shadow mode is, with the
//! rule the client is shown and the reply or headers it gets.

use super::shortcuts;
use super::Verdict;
use crate::decision::response::{self, RateLimitFields, Shown};
use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;
use ratelimit_config::config::Config;

/// The verdict on `results` (one per planned rule), and the headers for an allowed
/// response.
pub(super) fn decide(
    config: &Config,
    now_ms: u64,
    planned: &[PlannedRule],
    results: &[RuleResult],
) -> (Verdict, Option<RateLimitFields>) {
    let denied = planned
        .iter()
        .zip(results)
        .any(|(p, r)| !r.allowed && !p.shadow);
    let shown = most_restrictive(planned, results, denied)
        .and_then(|i| Some((planned.get(i)?, results.get(i)?)));
    let Some((rule, result)) = shown else {
        // Only rules in shadow mode, which show nothing; or no result to show at all.
        let only_shadow = !planned.is_empty() && planned.iter().all(|p| p.shadow);
        return match only_shadow && !denied {
            true => (Verdict::Resume, None),
            false => (Verdict::Reply(response::unavailable()), None),
        };
    };
    let shown = Shown {
        rule,
        all: planned,
        result,
        now_ms,
    };
    if denied {
        let reply = shortcuts::denial(config, &shown);
        return (Verdict::Reply(reply), None);
    }
    if !config.headers.on_allowed {
        return (Verdict::Resume, None);
    }
    (Verdict::Resume, Some(RateLimitFields::of(&shown, config)))
}

/// The rule the client is shown, never one in shadow mode (it must not change what clients
/// see). Denied: a rule that blocks the client, else the denying rule with the longest
/// wait. Allowed: the rule with the fewest tokens left. Ties go to the smaller bucket.
pub fn most_restrictive(
    planned: &[PlannedRule],
    results: &[RuleResult],
    denied: bool,
) -> Option<usize> {
    let candidates = planned
        .iter()
        .zip(results)
        .enumerate()
        .filter(|(_, (p, r))| !p.shadow && (!denied || !r.allowed));
    if denied {
        candidates
            .max_by_key(|(_, (p, r))| (r.blocked, r.wait_ms, std::cmp::Reverse(p.limit.burst)))
            .map(|(i, _)| i)
    } else {
        candidates
            .min_by_key(|(_, (p, r))| (r.remaining, p.limit.burst))
            .map(|(i, _)| i)
    }
}
