//! One request's admission: its rate-limit check, from the rules that apply to the
//! verdict.
//!
//! Host-independent: the proxy-wasm glue feeds it the request through `Proxy`, sends the
//! callout body it returns, and hands back the bridge's reply; everything it decides is
//! testable natively.

use crate::decision::breaker::{Breaker, Permit};
use crate::decision::counters::{Counter, RuleCounts};
use crate::decision::deny_cache::DenyCache;
use crate::decision::lease::Leases;
use crate::decision::local;
use crate::decision::metered::{self, Metering};
use crate::decision::response::{self, LocalReply, RateLimitFields};
use crate::decision::slots::{self, Ids, SlotLines};
use crate::host::Proxy;
use crate::request::rules::PlannedRule;
use crate::wire::{self, CheckResult, RuleResult};
use ratelimit_config::config::Config;
use ratelimit_config::options::FailureMode;

/// State a worker keeps across its requests.
#[derive(Debug)]
pub struct Worker {
    pub breaker: Breaker,
    pub deny_cache: DenyCache,
    pub leases: Leases,
    /// When a shadow denial was last logged (they are logged once a second at most).
    pub shadow_logged_ms: u64,
    /// What each rule of the worker's configuration did, not yet handed to the host.
    pub rule_counts: RuleCounts,
    /// Names the slots of its requests' in-flight rules.
    pub slot_ids: Ids,
}

impl Worker {
    pub fn new(config: &Config) -> Worker {
        Worker {
            breaker: Breaker::new(config.circuit_breaker, config.backend.timeout_ms),
            deny_cache: DenyCache::new(config.deny_cache_entries),
            leases: Leases::default(),
            shadow_logged_ms: 0,
            rule_counts: RuleCounts::new(config.rules.len()),
            slot_ids: Ids::default(),
        }
    }
}

/// What to do with the paused request once the check is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through (adding `response_headers` to its response).
    Resume,
    /// Answer it locally.
    Reply(LocalReply),
}

/// How the request's check starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// No rule applies: let it through untouched.
    Skip,
    /// Ask the bridge; the string is this check's line of an exchange.
    Ask(String),
    /// Decided without the bridge (the circuit breaker is open).
    Decided(Verdict),
    /// A rule reserves what the request's body asks: the body goes to `request_body`,
    /// then `body_ended` says how the check starts.
    ReadBody,
}

/// How a check ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    /// Denied from the deny cache, without asking the bridge.
    DeniedCached,
    /// Allowed, though a rule in shadow mode would have denied it.
    ShadowDenied,
    /// Allowed from this worker's leases, without asking the bridge.
    Leased,
    /// Refused because the client is blocked (by the bridge's answer or the cache).
    Blocked,
    /// The backend failed; the failure mode decided.
    BackendFailed,
    /// The bridge refused this check as malformed; the failure mode decided, and the
    /// backend is not blamed.
    Refused,
    /// The request repeated an identity header: answered 400 without a check.
    Rejected,
    /// The request lacked an identity a rule will not do without: refused without a check.
    Missing,
    /// The breaker was open; the failure mode decided without a callout.
    ShortCircuited,
}

impl Outcome {
    /// The counter this outcome counts in.
    pub fn counter(self) -> Counter {
        match self {
            Outcome::Allowed => Counter::Allowed,
            Outcome::Denied => Counter::Denied,
            Outcome::DeniedCached => Counter::DeniedCached,
            Outcome::Blocked => Counter::Blocked,
            Outcome::Leased => Counter::AllowedLeased,
            Outcome::ShadowDenied => Counter::ShadowDenied,
            Outcome::BackendFailed => Counter::BackendFailures,
            Outcome::ShortCircuited => Counter::ShortCircuits,
            Outcome::Refused => Counter::Refused,
            Outcome::Rejected => Counter::Rejected,
            Outcome::Missing => Counter::Missing,
        }
    }
}

/// One request's admission: the state between its headers and its verdict. (A *check* is
/// what it sends: its line of rules in an exchange.)
#[derive(Debug, Default)]
pub struct Admission {
    /// The rules sent to the bridge.
    planned: Vec<PlannedRule>,
    /// The rules admitted from this worker's leases, with what they show.
    leased: Vec<PlannedRule>,
    /// What each of `leased` shows (the lease's view of its bucket).
    leased_shown: Vec<RuleResult>,
    /// Headers to add to the upstream's response when the request is allowed.
    pub response_headers: Option<RateLimitFields>,
    /// An admitted request's metered rules: what they reserved, until the response ends.
    pub metering: Option<Metering>,
    /// What the request's body asks to reserve, while it is read.
    body: Option<body::BodyAsk>,
    /// Set once the check has ended.
    pub outcome: Option<Outcome>,
    /// This request's callout tests whether the backend is back (breaker half-open).
    probe: bool,
    /// When the check was asked for (the worker's clock): what the bridge says a bucket
    /// lacks is cached from then, which is before Redis read its clock.
    asked_ms: u64,
    /// A request to the quota API (`quota_api`), answered by the gateway.
    quota: bool,
    /// A quota request's looks at its client's other rules, sent after `planned`.
    looked: Vec<PlannedRule>,
}

impl Admission {
    /// Plans the check and says how it proceeds.
    pub fn start(&mut self, config: &Config, worker: &mut Worker, host: &impl Proxy) -> Start {
        if let Some(refused) = self.quota_request(config, host) {
            return refused;
        }
        match self.plan(config, worker, host, None) {
            Some(Start::ReadBody) => {
                // Its headers go upstream now, before the rules that apply are known.
                if metered::reads_body(config, 0..config.rules.len()) {
                    host.set_request_header("accept-encoding", b"identity");
                }
                self.body = Some(body::BodyAsk::for_identities(config, host));
                self.unframe_body(host);
                return Start::ReadBody;
            }
            // A quota request is answered even when no rule charges it.
            Some(Start::Skip) if self.quota => {}
            Some(start) => return start,
            None => {}
        }
        if metered::reads_body(config, self.planned.iter().map(|p| p.rule)) {
            host.set_request_header("accept-encoding", b"identity");
        }
        self.body = body::BodyAsk::of(config, &self.planned, host);
        self.unframe_body(host);
        if self.body.is_some() {
            // Its headers go upstream while its body is read: a client the worker knows
            // is short of the least its body can ask (`PlannedRule::cost` until then) is
            // refused first, before any upstream request.
            if let Some(verdict) = self.cached(config, worker, host.now_ms()) {
                self.body = None;
                return Start::Decided(verdict);
            }
            return Start::ReadBody;
        }
        self.proceed(config, worker, host)
    }

    /// The planned check goes on: decided by the worker, or asked of the bridge.
    fn proceed(&mut self, config: &Config, worker: &mut Worker, host: &impl Proxy) -> Start {
        let now_ms = host.now_ms();
        self.plan_looks(config, host);
        if let Some(verdict) = self.cached(config, worker, now_ms) {
            return Start::Decided(verdict);
        }
        self.asked_ms = now_ms;
        self.use_leases(config, &mut worker.leases, now_ms);
        if self.planned.is_empty() && self.looked.is_empty() {
            self.outcome = Some(Outcome::Leased);
            worker.rule_counts.leased(&self.leased);
            let verdict = self.decide(config, now_ms, &[]);
            return Start::Decided(self.quota_verdict(config, verdict, None, None, now_ms));
        }
        match worker.breaker.allow(now_ms) {
            Permit::Call => {}
            Permit::Probe => self.probe = true,
            Permit::Deny => {
                self.outcome = Some(Outcome::ShortCircuited);
                let verdict = self.failure_mode(config, host);
                self.update_leases(config, &mut worker.leases, &verdict, None);
                return Start::Decided(self.quota_verdict(config, verdict, None, None, now_ms));
            }
        }
        slots::name_slots(&mut self.planned, &mut worker.slot_ids);
        let mut body = String::with_capacity(64 * self.rule_count());
        let rules = self.planned.iter().chain(&self.looked);
        wire::encode_check(&mut body, rules.map(|p| p.spec_ref(config)));
        Start::Ask(body)
    }

    /// The lines that release and renew this request's slots, once its check is over and
    /// may have taken them (admitted, or not answered: a release of a slot never taken
    /// does nothing); `None` when it has none or took none.
    pub fn held_slots(&self, config: &Config) -> Option<SlotLines> {
        let took = matches!(
            self.outcome,
            Some(Outcome::Allowed | Outcome::ShadowDenied | Outcome::BackendFailed)
        );
        took.then(|| slots::slot_lines(config, &self.planned))
            .flatten()
    }

    /// The lines of this request's slots whatever became of its check (one gone while its
    /// check was out, whose answer no one will read).
    pub fn slot_lines(&self, config: &Config) -> Option<SlotLines> {
        slots::slot_lines(config, &self.planned)
    }

    /// How many rules this check sent (its line of a batched reply must answer as many).
    pub fn rule_count(&self) -> usize {
        self.planned.len() + self.looked.len()
    }

    /// Whether this check tests if the backend is back (breaker half-open).
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Decides from this check's line of the reply, or from why there is none. The
    /// exchange it travelled in has been counted in the breaker already (`record_exchange`).
    fn conclude(
        &mut self,
        config: &Config,
        worker: &mut Worker,
        host: &impl Proxy,
        mut result: Result<CheckResult, String>,
    ) -> Verdict {
        let looks = self.split_looks(&mut result);
        let verdict = self.verdict_of(config, worker, host, &result);
        let answered = match &result {
            Ok(CheckResult::Checked { rules, .. }) => Some(&rules[..]),
            _ => None,
        };
        self.update_leases(config, &mut worker.leases, &verdict, answered);
        self.quota_verdict(config, verdict, answered, looks, host.now_ms())
    }

    fn verdict_of(
        &mut self,
        config: &Config,
        worker: &mut Worker,
        host: &impl Proxy,
        result: &Result<CheckResult, String>,
    ) -> Verdict {
        match result {
            Ok(CheckResult::Checked { now_ms, rules }) => {
                let verdict = self.decide(config, *now_ms, rules);
                let denied = matches!(verdict, Verdict::Reply(_));
                if denied {
                    self.remember_denials(&mut worker.deny_cache, rules, host.now_ms());
                }
                let shadowed = !denied && self.shadow_denied(config, worker, rules, host.now_ms());
                worker.rule_counts.answered(&self.planned, rules, denied);
                if !denied {
                    worker.rule_counts.leased(&self.leased);
                    self.metering = Metering::reserved(config, &self.planned, rules);
                }
                self.outcome = Some(match (denied, rules.iter().any(|r| r.blocked)) {
                    (false, _) if shadowed => Outcome::ShadowDenied,
                    (false, _) => Outcome::Allowed,
                    (true, false) => Outcome::Denied,
                    (true, true) => Outcome::Blocked,
                });
                verdict
            }
            Ok(CheckResult::Settled { .. }) => {
                log::debug!("a check was answered as a settlement");
                self.outcome = Some(Outcome::BackendFailed);
                self.failure_mode(config, host)
            }
            Ok(CheckResult::Failed(reason)) | Err(reason) => {
                log::debug!("check failed ({reason})");
                self.outcome = Some(Outcome::BackendFailed);
                self.failure_mode(config, host)
            }
            Ok(CheckResult::Refused(reason)) => {
                // Counted (`refused`) rather than logged loudly: every request of a
                // misconfigured key prefix would write a line.
                log::debug!("the bridge refused a check ({reason})");
                self.outcome = Some(Outcome::Refused);
                self.failure_mode(config, host)
            }
        }
    }

    fn failure_mode(&mut self, config: &Config, host: &impl Proxy) -> Verdict {
        // Rules in shadow mode never deny, not even for want of an answer.
        if self.planned.iter().all(|p| p.shadow) {
            return Verdict::Resume;
        }
        match config.failure_mode {
            FailureMode::Open => Verdict::Resume,
            FailureMode::Closed => Verdict::Reply(response::unavailable()),
            FailureMode::Local => {
                let names: Vec<&str> = self
                    .planned
                    .iter()
                    .map(|p| config.rule_name(p.rule))
                    .collect();
                let now_ms = host.now_ms();
                let Some(results) = local::admit(host, &self.planned, &names, config.local, now_ms)
                else {
                    return Verdict::Reply(response::unavailable());
                };
                let verdict = self.decide(config, now_ms, &results);
                if verdict == Verdict::Resume {
                    // Its metered rules are settled in the same local buckets.
                    self.metering = Metering::reserved_locally(config, &self.planned, &results);
                }
                verdict
            }
        }
    }

    /// Decides from the results of the rules sent (those admitted from leases were
    /// admitted already), showing the most restrictive of all.
    fn decide(&mut self, config: &Config, now_ms: u64, results: &[RuleResult]) -> Verdict {
        let (verdict, headers) = match (self.planned.is_empty(), self.leased.is_empty()) {
            // A quota request that no rule charges.
            (true, true) => (Verdict::Resume, None),
            (_, true) => verdict::decide(config, now_ms, &self.planned, results),
            // All from leases (the hot path leases exist for): nothing to copy.
            (true, false) => verdict::decide(config, now_ms, &self.leased, &self.leased_shown),
            (false, false) => {
                let planned = [&self.planned[..], &self.leased[..]].concat();
                let all = [results, &self.leased_shown[..]].concat();
                verdict::decide(config, now_ms, &planned, &all)
            }
        };
        self.response_headers = headers;
        verdict
    }
}

mod body;
mod conclusion;
mod planning;
mod quota;
mod shortcuts;
mod verdict;

pub use conclusion::{
    conclude_exchange, decode_callout, exchange_failure, record_exchange, Concluding,
};
pub use verdict::most_restrictive;

#[cfg(test)]
#[path = "admission_deny_cache_tests.rs"]
mod deny_cache_tests;
#[cfg(test)]
#[path = "admission_failure_tests.rs"]
mod failure_tests;
#[cfg(test)]
#[path = "admission_lease_tests.rs"]
mod lease_tests;
#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
