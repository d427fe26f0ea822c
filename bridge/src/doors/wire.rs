//! One exchange of the wire format (defined in the `ratelimit-protocol` crate): a batch in,
//! its answer out, shared by the HTTP and the gRPC stream transports.

use crate::engine::{Engine, Intent};
use crate::ops::labels::{Failure, Outcome, Transport};
use crate::ops::metrics::Metrics;
use crate::store::check::{Check, CheckOutcome};
pub use ratelimit_protocol::MAX_BODY;
use ratelimit_protocol::{parse_batch, render_reply, BadBatch, CheckResult, Line, LineKind};
use std::time::Instant;

/// Where a line of the batch went.
enum Place {
    /// Refused alone, for this reason.
    Refused(String),
    Checked,
    Returned,
    Settled,
}

/// Answers one batch through the `engine`: every readable line it admits (keys in the
/// store's keyspace, global rules the regions can run) is run (the checks together, in
/// order; the lease returns together; the settlements together); any other line is refused
/// alone (`?`, which the filter never holds against the backend). A check's rule with an
/// active override is run under the override (`overrides`), and so is a settlement's,
/// which corrects what a check took. A lease return is not: it returns a lease's tokens,
/// which only the rule's own bucket gives (no lease is taken under an override), so they go
/// back there. A check's global rules are paid from this bridge's leases of their ledgers
/// (`regions`); without regions a global rule is a plain one, the one region's. The error
/// is for a body that is no batch at all. The metrics count the exchange (by `transport`)
/// and each check's outcome; a refused line counts as a refused check, whatever its kind.
pub async fn answer(
    engine: &Engine,
    transport: Transport,
    body: &[u8],
    out: &mut String,
) -> Result<(), BadBatch> {
    let read_at = Instant::now();
    let metrics = engine.store().metrics();
    metrics.exchange(transport);
    let lines = parse_batch(body).inspect_err(|_| metrics.failure(Failure::BadBatch))?;
    let mut checks: Vec<Check> = Vec::new();
    let mut returns: Vec<Check> = Vec::new();
    let mut settlements: Vec<Check> = Vec::new();
    let mut places = Vec::new();
    let intake = engine.intake();
    for line in lines {
        let line = line.and_then(|mut line| {
            let intent = match line.kind {
                LineKind::Check => Intent::Check,
                LineKind::LeaseReturn => Intent::Return,
                LineKind::Settlement => Intent::Settle,
            };
            intake.admit_gateways(intent, &mut line.rules)?;
            Ok(line)
        });
        places.push(match line {
            Ok(Line { kind, rules }) => {
                let (lines, place) = match kind {
                    LineKind::Check => (&mut checks, Place::Checked),
                    LineKind::LeaseReturn => (&mut returns, Place::Returned),
                    LineKind::Settlement => (&mut settlements, Place::Settled),
                };
                lines.push(rules);
                place
            }
            Err(reason) => Place::Refused(reason),
        });
    }
    let mut checked = engine.check_all(&checks).await.into_iter();
    let mut checked_rules = checks.iter();
    let mut returned = engine.return_leases(&returns).await.into_iter();
    let mut settled = engine.settle_all(&settlements).await.into_iter();
    let results: Vec<CheckResult> = places
        .into_iter()
        .map(|place| {
            let result = match place {
                Place::Refused(reason) => {
                    log::debug!("check refused: {reason}");
                    CheckResult::Refused(reason)
                }
                Place::Checked => in_force(ran(checked.next()), checked_rules.next(), metrics),
                // Not a check: `script_calls_total{mode="refund"}` counts its script calls.
                Place::Returned => return ran(returned.next()),
                // Nor is a settlement (`mode="settle"`).
                Place::Settled => {
                    return match ran(settled.next()) {
                        CheckResult::Checked { now_ms, rules } => {
                            CheckResult::Settled { now_ms, rules }
                        }
                        other => other,
                    }
                }
            };
            metrics.check(counted_as(&result));
            result
        })
        .collect();
    render_reply(out, &results);
    metrics.exchange_answered(read_at.elapsed());
    Ok(())
}

/// What the reply says of a line the store ran.
fn ran(outcome: Option<CheckOutcome>) -> CheckResult {
    match outcome.unwrap_or_else(|| Err("the store gave no answer".into())) {
        Ok((now_ms, rules)) => CheckResult::Checked { now_ms, rules },
        Err(reason) => {
            log::warn!("check failed: {reason}");
            CheckResult::Failed(reason)
        }
    }
}

/// `result` of the check `rules` with the size in force of each bucket the bridge put
/// another limit on (a plan's, an override's), for the gateway to show, each plan's rule
/// counted under its plan's name.
fn in_force(mut result: CheckResult, rules: Option<&Check>, metrics: &Metrics) -> CheckResult {
    if let (CheckResult::Checked { rules: results, .. }, Some(rules)) = (&mut result, rules) {
        for (r, rule) in results.iter_mut().zip(rules) {
            if let Some(plan) = &rule.plan {
                metrics.plan_check(plan, r.allowed);
            }
            if rule.plan.is_some() || rule.overridden.is_some() {
                r.limit = rule.overridden.map_or(rule.burst, |o| o.burst);
            }
        }
    }
    result
}

/// How a check counts in the metrics.
fn counted_as(result: &CheckResult) -> Outcome {
    match result {
        CheckResult::Checked { rules, .. } if rules.iter().all(|r| r.allowed) => Outcome::Allowed,
        CheckResult::Checked { .. } => Outcome::Denied,
        CheckResult::Settled { .. } => Outcome::Allowed,
        CheckResult::Failed(_) => Outcome::Failed,
        CheckResult::Refused(_) => Outcome::Refused,
    }
}
