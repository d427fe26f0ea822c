//! Which rules a request's check holds: planned from its headers, or, when a rule that may
//! apply is keyed on a field of its body, from its headers as kept and its body once that
//! has ended; or the answer that makes a check needless (a refusal, no rule at all).

use super::{Admission, Outcome, Start, Verdict, Worker};
use crate::decision::counters::Counter;
use crate::decision::response;
use crate::host::RequestView;
use crate::request::rules::{self, BodyValues, Unplanned};
use ratelimit_config::config::Config;

impl Admission {
    /// Plans the rules that apply to `req` (`body`: the body identities' values, once it
    /// has been read); how the request proceeds when that decides it already: refused, let
    /// through with no rule, or (`ReadBody`) held for its body, which a rule that may apply
    /// is keyed on.
    pub(super) fn plan(
        &mut self,
        config: &Config,
        worker: &mut Worker,
        req: &impl RequestView,
        body: Option<&BodyValues>,
    ) -> Option<Start> {
        let mut shadowed = Vec::new();
        let planned = rules::plan(config, req, body, |r| shadowed.push(r));
        let counts = &mut worker.rule_counts;
        if planned != Err(Unplanned::AwaitsBody) {
            for rule in shadowed {
                counts.add(rule, Counter::ShadowDenied);
            }
        }
        self.planned = match planned {
            Ok(planned) => planned,
            Err(Unplanned::Bad(bad)) => {
                self.outcome = Some(Outcome::Rejected);
                return Some(Start::Decided(Verdict::Reply(response::bad_identity(&bad))));
            }
            Err(Unplanned::Missing { rule, identity }) => {
                self.outcome = Some(Outcome::Missing);
                counts.add(rule, Counter::Missing);
                let reply = response::missing_identity(config, rule, identity);
                return Some(Start::Decided(Verdict::Reply(reply)));
            }
            Err(Unplanned::AwaitsBody) => return Some(Start::ReadBody),
        };
        self.planned.is_empty().then_some(Start::Skip)
    }
}
