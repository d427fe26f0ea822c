//! One request's rate-limit check, from the rules that apply to the verdict.
//!
//! Host-independent: the proxy-wasm glue feeds it the request, sends the callout body it
//! returns, and hands back the bridge's reply; everything it decides is testable natively.

use crate::config::{Config, FailureMode};
use crate::identity::RequestView;
use crate::protocol::{self, CheckResult, RuleResult};
use crate::response::{self, LocalReply, Shown};
use crate::rules::{self, PlannedRule};

/// What to do with the paused request once the check is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through (adding `response_headers` to its response).
    Resume,
    /// Answer it locally.
    Reply(LocalReply),
}

/// The state of one request between its headers and the bridge's reply.
#[derive(Debug, Default)]
pub struct Check {
    planned: Vec<PlannedRule>,
    /// Headers to add to the upstream's response when the request is allowed.
    pub response_headers: Vec<(&'static str, String)>,
}

impl Check {
    /// Plans the check; returns the callout body, or `None` when no rule applies.
    pub fn start(&mut self, config: &Config, req: &impl RequestView) -> Option<String> {
        self.planned = rules::plan(config, req);
        if self.planned.is_empty() {
            return None;
        }
        let mut body = String::with_capacity(64 * self.planned.len());
        protocol::encode_check(&mut body, &self.planned);
        Some(body)
    }

    /// Decides from the bridge's reply (`status` is the HTTP status, `None` when the
    /// callout failed or timed out).
    pub fn finish(&mut self, config: &Config, status: Option<u32>, body: &[u8]) -> Verdict {
        if status != Some(200) {
            let reason = match status {
                Some(s) => format!("bridge answered HTTP {s}"),
                None => "callout failed or timed out".to_string(),
            };
            return self.fail(config, &reason);
        }
        match protocol::decode_reply(body, &[self.planned.len()]) {
            Ok(mut results) => match results.pop() {
                Some(CheckResult::Checked { now_ms, rules }) => self.decide(config, now_ms, &rules),
                Some(CheckResult::Failed(reason)) => self.fail(config, &reason),
                None => self.fail(config, "empty reply"),
            },
            Err(bad) => self.fail(config, bad.0),
        }
    }

    /// Applies the failure mode: the limiter could not decide.
    pub fn fail(&mut self, config: &Config, reason: &str) -> Verdict {
        log::warn!(
            "check failed ({reason}); failure_mode {:?}",
            config.failure_mode
        );
        match config.failure_mode {
            FailureMode::Open => Verdict::Resume,
            FailureMode::Closed => Verdict::Reply(response::unavailable()),
        }
    }

    fn decide(&mut self, config: &Config, now_ms: u64, results: &[RuleResult]) -> Verdict {
        let denied = results.iter().any(|r| !r.allowed);
        let Some(index) = most_restrictive(&self.planned, results, denied) else {
            return self.fail(config, "no rule result");
        };
        let (Some(planned), Some(result)) = (self.planned.get(index), results.get(index)) else {
            return self.fail(config, "no rule result");
        };
        let shown = Shown {
            name: config
                .rules
                .get(planned.rule)
                .map_or("", |r| r.name.as_str()),
            limit: &planned.limit,
            result,
            now_ms,
        };
        if denied {
            return Verdict::Reply(response::too_many_requests(&shown, config));
        }
        if config.headers.on_allowed {
            self.response_headers = response::rate_limit_headers(&shown, config.headers);
        }
        Verdict::Resume
    }
}

/// The rule the client is shown. Denied: the denying rule with the longest wait. Allowed:
/// the rule with the fewest tokens left. Ties go to the smaller bucket.
pub fn most_restrictive(
    planned: &[PlannedRule],
    results: &[RuleResult],
    denied: bool,
) -> Option<usize> {
    let candidates = planned
        .iter()
        .zip(results)
        .enumerate()
        .filter(|(_, (_, r))| !denied || !r.allowed);
    if denied {
        candidates
            .max_by_key(|(_, (p, r))| (r.wait_ms, std::cmp::Reverse(p.limit.burst)))
            .map(|(i, _)| i)
    } else {
        candidates
            .min_by_key(|(_, (p, r))| (r.remaining, p.limit.burst))
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
