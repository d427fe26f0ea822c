//! One `ShouldRateLimit` call answered from the token buckets: each descriptor's limit found
//! in the configuration (or the caller's override), its hits asked of Redis, and the answer
//! Envoy reads: the overall code, a status per descriptor, and the `X-RateLimit-*` headers.
//!
//! Hits come in two kinds, as Envoy sends them:
//! - the request's own (`hits_addend` of the request, 1 when unset) are a **check**: the
//!   descriptors' buckets are asked together, all or nothing, and a refused request takes
//!   nothing, so clients held at the limit do not drain it further;
//! - a descriptor's own `hits_addend` (what Envoy Gateway's `cost` and AI Gateway's token
//!   usage send, at the request and with `apply_on_stream_done`) is a **cost**: 0 only asks
//!   whether the bucket holds a token; more is taken in full, past 0 down to one bucket of
//!   debt, and the answer is over the limit if the bucket could not pay it. A cost reported
//!   after the response is thus never lost to a bucket that ran low meanwhile.

use super::limits::{unit_ms, Limits, Quota, Rule};
use super::proto::{
    DescriptorStatus, Duration, HeaderValue, RateLimit, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, CODE_OK, CODE_OVER_LIMIT,
};
use crate::check::{Check, RuleOutcome, RuleSpec};
use crate::rls_metrics::{Hits, RuleLabel};
use crate::store::Store;
use ratelimit_config::digest::sha256_hex;
use ratelimit_config::keys::{bucket_key, key_safe};
use ratelimit_config::limit::Limit;
use ratelimit_protocol::{Settle, MAX_EXACT};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The rule segment of every bucket key the service makes: `prefix:rls:domain:key:value...`.
pub const RULE: &str = "rls";
/// Descriptors in one call, and entries in one descriptor: Envoy sends a handful.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;

/// Which headers the answer asks Envoy to add to the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponseHeaders {
    /// None: Envoy's own `enable_x_ratelimit_headers` may make them from the statuses.
    Off,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (IETF draft 03, as Envoy writes them),
    /// and `Retry-After` when over the limit.
    Draft03,
}

/// What the service needs besides the configuration.
pub struct Service {
    /// The bridge's first key prefix.
    pub prefix: String,
    pub headers: ResponseHeaders,
    /// Makes each cost's settlement id unique (the script applies an id once).
    pub costs: AtomicU64,
    pub cost_ids: String,
}

/// What is asked of a descriptor's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// No limit applies: within.
    Free,
    /// Over without asking Redis: a limit of 0, or hits no full bucket holds.
    Over,
    Check,
    Read,
    Cost,
}

struct Planned {
    rule: Option<Arc<Rule>>,
    ask: Ask,
    hits: u64,
    /// Index of its rule in the call of its kind.
    at: usize,
}

impl Service {
    /// Answers `request`, or why it cannot be (the caller's input, or Redis failing).
    pub async fn answer(
        &self,
        limits: &Limits,
        store: &Store,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Refusal> {
        if request.domain.is_empty() {
            return Err(Refusal::Invalid("the domain is empty".into()));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Refusal::Invalid(format!(
                "more than {MAX_DESCRIPTORS} descriptors"
            )));
        }
        let wide_hits = match request.hits_addend {
            0 => 1,
            n => u64::from(n),
        };
        let mut planned = Vec::with_capacity(request.descriptors.len());
        let (mut check, mut read, mut cost) = (Check::new(), Check::new(), Check::new());
        let found: Vec<Option<Arc<Rule>>> = request
            .descriptors
            .iter()
            .map(|d| rule_of(limits, &request.domain, d))
            .collect::<Result<_, _>>()?;
        let replaced: Vec<&str> = found
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        for (descriptor, rule) in request.descriptors.iter().zip(&found) {
            let rule = rule
                .clone()
                .filter(|r| r.name.is_empty() || !replaced.contains(&r.name.as_str()));
            let own = descriptor.hits_addend.as_ref().map(|h| h.value);
            let hits = own.unwrap_or(wide_hits).min(MAX_EXACT - 1);
            let Some(rule) = rule else {
                planned.push(Planned {
                    rule: None,
                    ask: Ask::Free,
                    hits,
                    at: 0,
                });
                continue;
            };
            let (ask, at) = match (rule.quota, own) {
                (Quota::Unlimited, _) => (Ask::Free, 0),
                (Quota::Blocked, _) => (Ask::Over, 0),
                (Quota::Bucket(limit), _) if own.is_none() && hits > limit.burst => (Ask::Over, 0),
                (Quota::Bucket(limit), None) => {
                    let spec = self.spec(&request.domain, descriptor, &rule, &limit, hits);
                    check.push(spec);
                    (Ask::Check, check.len() - 1)
                }
                (Quota::Bucket(limit), Some(0)) => {
                    read.push(self.spec(&request.domain, descriptor, &rule, &limit, 1));
                    (Ask::Read, read.len() - 1)
                }
                (Quota::Bucket(limit), Some(_)) => {
                    let mut spec = self.spec(&request.domain, descriptor, &rule, &limit, 1);
                    spec.cost = 0;
                    spec.settle = Some(Settle {
                        delta: hits as i64,
                        debt: limit.burst,
                        id: String::new(),
                    });
                    cost.push(spec);
                    (Ask::Cost, cost.len() - 1)
                }
            };
            planned.push(Planned {
                rule: Some(rule),
                ask,
                hits,
                at,
            });
        }
        let id = format!(
            "{}-{}",
            self.cost_ids,
            self.costs.fetch_add(1, Ordering::Relaxed)
        );
        for spec in &mut cost {
            if let Some(settle) = &mut spec.settle {
                settle.id.clone_from(&id);
            }
        }
        let (checked, were, costed) = tokio::join!(
            run(!check.is_empty(), || store.check(&check)),
            run(!read.is_empty(), || store.read(&read)),
            run(!cost.is_empty(), || async {
                let mut settled = store.settle_all(std::slice::from_ref(&cost)).await;
                settled.pop().unwrap_or_else(|| Err("no answer".into()))
            }),
        );
        let (checked, were, costed) = (
            checked.map_err(Refusal::Failed)?,
            were.map_err(Refusal::Failed)?,
            costed.map_err(Refusal::Failed)?,
        );
        let mut response = RateLimitResponse {
            overall_code: CODE_OK,
            ..RateLimitResponse::default()
        };
        let mut shown: Option<(&Rule, RuleOutcome)> = None;
        let metrics = &store.metrics().rls;
        for plan in &planned {
            let outcome = match plan.ask {
                Ask::Free | Ask::Over => None,
                Ask::Check => checked.get(plan.at).cloned(),
                Ask::Read => were.get(plan.at).cloned().map(|mut o| {
                    o.allowed = o.remaining >= 1 && o.owed == 0;
                    o
                }),
                Ask::Cost => costed.get(plan.at).cloned().map(|mut o| {
                    o.allowed = o.borrowed == 0;
                    o
                }),
            };
            let Some(rule) = plan.rule.as_deref() else {
                response.statuses.push(DescriptorStatus {
                    code: CODE_OK,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            // A rule in shadow mode that lacked the hits is admitted, saying how long
            // enforcing it would have made the request wait.
            let over = plan.ask == Ask::Over
                || outcome
                    .as_ref()
                    .is_some_and(|o| !o.allowed || (rule.shadow && o.wait_ms > 0));
            let became = match (over, rule.shadow) {
                (true, false) => Hits::Over,
                (true, true) => Hits::Shadow,
                (false, _) if near(rule, outcome.as_ref()) => Hits::Near,
                (false, _) => Hits::Within,
            };
            let label = RuleLabel {
                domain: request.domain.clone(),
                key: rule.path.clone(),
            };
            metrics.hits(&label, plan.hits, became);
            let code = if became == Hits::Over {
                response.overall_code = CODE_OVER_LIMIT;
                CODE_OVER_LIMIT
            } else {
                CODE_OK
            };
            let outcome = outcome.unwrap_or(RuleOutcome {
                allowed: !over,
                ..RuleOutcome::default()
            });
            response.statuses.push(DescriptorStatus {
                code,
                current_limit: (rule.quota != Quota::Unlimited).then(|| RateLimit {
                    requests_per_unit: rule.requests_per_unit,
                    unit: rule.unit,
                    name: rule.name.clone(),
                }),
                limit_remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(Duration::from_ms(outcome.full_ms)),
            });
            let tighter = match &shown {
                None => true,
                Some((_, o)) => (!outcome.allowed, o.remaining) > (!o.allowed, outcome.remaining),
            };
            if rule.quota != Quota::Unlimited && tighter && !rule.shadow {
                shown = Some((rule, outcome));
            }
        }
        if let (ResponseHeaders::Draft03, Some((rule, outcome))) = (self.headers, shown) {
            response.response_headers_to_add = draft03(rule, &outcome);
        }
        Ok(response)
    }

    /// The rule of `descriptor`'s bucket, as the script takes it.
    fn spec(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        rule: &Rule,
        limit: &Limit,
        cost: u64,
    ) -> RuleSpec {
        let mut values = vec![value(domain)];
        for (i, entry) in descriptor.entries.iter().enumerate() {
            values.push(value(&entry.key));
            match rule.shared.iter().find(|(at, _)| *at == i) {
                Some((_, pattern)) => values.push(value(pattern)),
                None => values.push(value(&entry.value)),
            }
        }
        let key = bucket_key(&self.prefix, RULE, &values);
        let mut spec = RuleSpec::plain(key, limit.burst, limit.num, limit.den, cost);
        spec.shadow = rule.shadow;
        spec
    }
}

/// Why a call was not answered.
#[derive(Debug)]
pub enum Refusal {
    /// The caller's input: `INVALID_ARGUMENT`.
    Invalid(String),
    /// Redis: `UNAVAILABLE`, and Envoy applies its failure mode.
    Failed(String),
}

/// A value in a key: escaped, and the empty value as the digest of nothing (a digest no
/// escaped value equals).
fn value(text: &str) -> String {
    key_safe(text.as_bytes()).map_or_else(|| format!("#{}", sha256_hex(b"")), Into::into)
}

/// The descriptor's limit: the caller's override, in the configured descriptor's place if
/// there is one, or the configured limit.
fn rule_of(
    limits: &Limits,
    domain: &str,
    descriptor: &RateLimitDescriptor,
) -> Result<Option<Arc<Rule>>, Refusal> {
    let entries = &descriptor.entries;
    if entries.len() > MAX_ENTRIES {
        return Err(Refusal::Invalid(format!(
            "a descriptor has more than {MAX_ENTRIES} entries"
        )));
    }
    if entries.iter().any(|e| e.key.is_empty()) {
        return Err(Refusal::Invalid(
            "a descriptor entry has an empty key".into(),
        ));
    }
    let found = limits.find(
        domain,
        entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
    );
    let Some(wanted) = &descriptor.limit else {
        return Ok(found.cloned());
    };
    let ms = unit_ms(wanted.unit).ok_or_else(|| {
        Refusal::Invalid(format!(
            "a limit override's unit {} is unknown",
            wanted.unit
        ))
    })?;
    let quota = match wanted.requests_per_unit {
        0 => Quota::Blocked,
        n => Quota::Bucket(Limit::new(u64::from(n), ms, None, 1).map_err(|(_, why)| {
            Refusal::Invalid(format!(
                "a limit override of {n} per unit {}: {why}",
                wanted.unit
            ))
        })?),
    };
    let mut rule = found.map_or_else(
        || Rule {
            path: "override".into(),
            name: String::new(),
            quota,
            requests_per_unit: 0,
            unit: 0,
            shadow: false,
            replaces: Vec::new(),
            shared: Vec::new(),
        },
        |r| Rule::clone(r),
    );
    rule.quota = quota;
    rule.requests_per_unit = wanted.requests_per_unit;
    rule.unit = wanted.unit;
    Ok(Some(Arc::new(rule)))
}

/// A fifth of the limit or less left after the hits.
fn near(rule: &Rule, outcome: Option<&RuleOutcome>) -> bool {
    match (rule.quota, outcome) {
        (Quota::Bucket(limit), Some(o)) => o.remaining.saturating_mul(5) <= limit.burst,
        _ => false,
    }
}

async fn run<F, Fut>(needed: bool, call: F) -> Result<Vec<RuleOutcome>, String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(u64, Vec<RuleOutcome>), String>>,
{
    if !needed {
        return Ok(Vec::new());
    }
    call().await.map(|(_, rules)| rules)
}

/// `X-RateLimit-*` of the tightest limit, as Envoy's own draft-03 headers read.
fn draft03(rule: &Rule, outcome: &RuleOutcome) -> Vec<HeaderValue> {
    let window_s = unit_ms(rule.unit).map_or(1, |ms| ms / 1000);
    let n = rule.requests_per_unit;
    let seconds = |ms: u64| ms.div_ceil(1000).to_string();
    let mut headers = vec![
        header("x-ratelimit-limit", format!("{n}, {n};w={window_s}")),
        header("x-ratelimit-remaining", outcome.remaining.to_string()),
        header("x-ratelimit-reset", seconds(outcome.full_ms)),
    ];
    if !outcome.allowed {
        headers.push(header("retry-after", seconds(outcome.wait_ms.max(1))));
    }
    headers
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
    }
}
