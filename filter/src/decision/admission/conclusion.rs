//! How an exchange ends: its reply decoded, the breaker counting it once whatever it
//! carried, then each member concluded (a request's check decided, a lease topped up).

use super::{Admission, Verdict, Worker};
use crate::decision::breaker::Failure;
use crate::host::Proxy;
use crate::wire::{self, CheckResult};
use ratelimit_config::config::Config;

/// Decodes a callout's reply to checks of `rule_counts` rules each; the error says why the
/// whole callout is unusable.
pub fn decode_callout(
    status: Option<u32>,
    body: &[u8],
    rule_counts: &[usize],
) -> Result<Vec<CheckResult>, String> {
    match status {
        Some(200) => wire::decode_reply(body, rule_counts).map_err(|bad| bad.0.to_string()),
        Some(s) => Err(format!("bridge answered HTTP {s}")),
        None => Err("callout failed or timed out".to_string()),
    }
}

/// What an exchange's member is to the worker concluding it.
pub enum Concluding<'a> {
    /// A request's check, decided under the configuration it started with.
    Check(&'a Config, &'a mut Admission),
    /// A lease's top-up (`Leases::top_up`).
    TopUp(u32),
    /// A lease's return, or the check of a request that went away: nothing to decide.
    Nothing,
}

/// Ends the members of one exchange from its reply (or why there is none): the breaker of
/// `config`'s worker counts the exchange once, then each check is decided from its own
/// line; the verdicts come back in the members' order (`None` where there is nothing to
/// carry out).
pub fn conclude_exchange(
    config: &Config,
    worker: &mut Worker,
    host: &impl Proxy,
    reply: Result<Vec<CheckResult>, String>,
    mut members: Vec<Concluding<'_>>,
) -> Vec<Option<Verdict>> {
    let probe = members
        .iter()
        .any(|m| matches!(m, Concluding::Check(_, admission) if admission.probe));
    record_exchange(
        config,
        worker,
        host.now_ms(),
        probe,
        exchange_failure(&reply),
    );
    let results: Vec<Result<CheckResult, String>> = match reply {
        Ok(results) => results.into_iter().map(Ok).collect(),
        Err(reason) => vec![Err(reason); members.len()],
    };
    members
        .iter_mut()
        .zip(results)
        .map(|(member, result)| match member {
            Concluding::Check(config, admission) => {
                Some(admission.conclude(config, worker, host, result))
            }
            Concluding::TopUp(id) => {
                let granted = match &result {
                    Ok(CheckResult::Checked { rules, .. }) => rules.first(),
                    _ => None,
                };
                worker.leases.topped_up(*id, granted);
                None
            }
            Concluding::Nothing => None,
        })
        .collect()
}

/// Why an exchange counts as a backend failure, if it does: no usable reply, or a check
/// the bridge could not run. A check the bridge refused is that check's own fault: a
/// client must never be able to open the breaker for everyone with its own bad input.
pub fn exchange_failure(reply: &Result<Vec<CheckResult>, String>) -> Option<&str> {
    match reply {
        Err(reason) => Some(reason),
        Ok(results) => results.iter().find_map(|r| match r {
            CheckResult::Failed(reason) => Some(reason.as_str()),
            CheckResult::Checked { .. } | CheckResult::Settled { .. } | CheckResult::Refused(_) => {
                None
            }
        }),
    }
}

/// Counts one exchange in the breaker: one success or one failure however many checks it
/// carried, so a failed batch weighs what a failed single check does. `probe`: the
/// exchange carried the half-open breaker's probe.
pub fn record_exchange(
    config: &Config,
    worker: &mut Worker,
    now_ms: u64,
    probe: bool,
    failure: Option<&str>,
) {
    let Some(reason) = failure else {
        if worker.breaker.record_success() {
            log::info!("backend answers again: circuit closed");
        }
        return;
    };
    // Log the transitions, not every exchange of an outage.
    let mode = config.failure_mode;
    match worker.breaker.record_failure(now_ms, probe) {
        Failure::FirstOfRun => log::warn!("check failed ({reason}); failure_mode {mode:?}"),
        Failure::Opened(ms) => {
            log::warn!("check failed ({reason}); circuit open for {ms} ms, failure_mode {mode:?}")
        }
        Failure::Counted | Failure::Ignored => log::debug!("check failed ({reason})"),
    }
}
