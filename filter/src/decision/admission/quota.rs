//! A quota request (`quota_api`): checked as any request to its path is (so that it is rate
//! limited itself), with a look at every other rule of its client in the same line, and
//! answered by the gateway with what its check saw, never sent upstream.

use super::{Admission, Start, Verdict};
use crate::decision::quota;
use crate::decision::response::{self, LocalReply};
use crate::host::RequestView;
use crate::request::rules::{self, PlannedRule};
use crate::wire::{CheckResult, RuleResult};
use ratelimit_config::config::Config;
use ratelimit_config::path;

impl Admission {
    /// Marks a request to the quota API's path (normalized, as rules match it) a quota
    /// request; one of another method than GET or HEAD is refused at once.
    pub(super) fn quota_request(
        &mut self,
        config: &Config,
        req: &impl RequestView,
    ) -> Option<Start> {
        let api = config.quota_api.as_ref()?;
        if path::normalize(req.header(":path").unwrap_or_default()) != api.path.as_bytes() {
            return None;
        }
        self.quota = true;
        match req.header(":method") {
            Some(b"GET" | b"HEAD") => None,
            _ => Some(Start::Decided(Verdict::Reply(not_allowed()))),
        }
    }

    /// A quota request's looks, planned once its charged rules are. Its in-flight rules
    /// are looks too: answered at once, it would hold a slot for nothing, and a client at
    /// its most in flight may still read its quota.
    pub(super) fn plan_looks(&mut self, config: &Config, req: &impl RequestView) {
        if self.quota {
            self.planned.retain(|p| p.slot.is_none());
            self.looked = rules::looks(config, req, &self.planned);
        }
    }

    /// Splits a quota request's line of the reply: its charged rules' results stay in
    /// `result`, its looks' come back (with Redis's time).
    pub(super) fn split_looks(
        &self,
        result: &mut Result<CheckResult, String>,
    ) -> Option<(u64, Vec<RuleResult>)> {
        match result {
            Ok(CheckResult::Checked { now_ms, rules }) if self.quota => {
                let at = self.planned.len().min(rules.len());
                Some((*now_ms, rules.split_off(at)))
            }
            _ => None,
        }
    }

    /// What a quota request gets instead of going upstream: its check's refusal if it was
    /// refused, else every rule of its client as its check answered (`charged`: its own
    /// rules' results, `looks`: the looks' with Redis's time), or 503 without an answer. Any
    /// other request's verdict is `verdict`.
    pub(super) fn quota_verdict(
        &self,
        config: &Config,
        verdict: Verdict,
        charged: Option<&[RuleResult]>,
        looks: Option<(u64, Vec<RuleResult>)>,
        now_ms: u64,
    ) -> Verdict {
        if !self.quota || verdict != Verdict::Resume {
            return verdict;
        }
        let answered = match (charged, looks) {
            (Some(charged), Some(looks)) => Some((charged, looks)),
            // Nothing asked: its rules were all admitted from leases, or it has none.
            (None, None) if self.planned.is_empty() && self.looked.is_empty() => {
                Some((&[][..], (now_ms, Vec::new())))
            }
            _ => None,
        };
        let Some((charged, (now_ms, looks))) = answered else {
            return Verdict::Reply(response::unavailable());
        };
        // A rule in shadow mode never changes what a client sees (looks are shadow rules
        // only on the wire).
        let own = (self.planned.iter().zip(charged)).filter(|(p, _)| !p.shadow);
        let shown: Vec<(&PlannedRule, &RuleResult)> = own
            .chain(self.leased.iter().zip(&self.leased_shown))
            .chain(self.looked.iter().zip(&looks))
            .collect();
        Verdict::Reply(quota::answer(config, now_ms, &shown))
    }
}

/// The quota API answers GET (and HEAD) only.
fn not_allowed() -> LocalReply {
    LocalReply {
        status: 405,
        headers: vec![
            ("allow", "GET, HEAD".into()),
            ("content-type", "application/json".into()),
        ],
        body: "{\"error\": \"Method not allowed\", \"message\": \"The quota API answers GET.\"}"
            .into(),
    }
}
