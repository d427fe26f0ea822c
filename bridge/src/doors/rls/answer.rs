//! One `ShouldRateLimit` call answered from the token buckets: its lines (`lines`) run as
//! script calls, together (the check, the reads and the costs at once), and the answer
//! Envoy reads: the overall code, a status per descriptor, the response headers (the
//! bridge's `X-RateLimit-*`, envoyproxy/ratelimit's `RateLimit-*`, or none), and for a call
//! holding reservations, what they took (`ratelimit.reserved` in the dynamic
//! metadata), which the commit at the stream's end names: the bridge's own record, where
//! a client's header could say anything.

use super::dynamic;
use super::limits::{Limits, Quota, Rule};
use super::lines::{lines, Ask, DescriptorLine, Refusal, RESERVED};
use super::metrics::{Hits, RlsMetrics};
use super::proto::{
    DescriptorStatus, Duration, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse,
    Struct, Value, CODE_OK, CODE_OVER_LIMIT,
};
use super::raw::unit_ms;
use crate::engine::{Engine, Intent};
use crate::store::check::RuleOutcome;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which headers the answer asks Envoy to add to the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponseHeaders {
    /// None: Envoy's own `enable_x_ratelimit_headers` may make them from the statuses.
    Off,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (IETF draft 03, as Envoy writes them),
    /// and `Retry-After` when over the limit.
    Draft03,
    /// envoyproxy/ratelimit's (`LIMIT_RESPONSE_HEADERS_ENABLED`): `RateLimit-Limit` (the
    /// requests per unit), `-Remaining`, `-Reset` (whole seconds), under the names given.
    Reference,
}

/// What the answer adds to responses: which headers, and the names `Reference` gives them
/// (envoyproxy/ratelimit's `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
/// `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headers {
    pub kind: ResponseHeaders,
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl From<ResponseHeaders> for Headers {
    /// `kind`, with envoyproxy/ratelimit's default names.
    fn from(kind: ResponseHeaders) -> Headers {
        Headers {
            kind,
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// What the service needs besides the configuration.
pub struct Service {
    /// The bridge's first key prefix.
    pub prefix: String,
    pub headers: Headers,
    /// Every call over a limit answered OK (`Options::shadow`).
    pub shadow: bool,
    /// envoyproxy/ratelimit's dynamic metadata added (`Options::dynamic_metadata`).
    pub dynamic_metadata: bool,
    /// Makes each cost's settlement id unique (the script applies an id once).
    pub costs: AtomicU64,
    pub cost_ids: String,
    /// The per-limit series, shown on `/metrics` beside the bridge's others.
    pub metrics: RlsMetrics,
}

impl Service {
    /// Answers `request` through the `engine`, or why it cannot be (the caller's input, or
    /// Redis failing): its buckets under the operators' overrides, its global limits paid
    /// from this bridge's leases (`regions`; without them, a global limit is a plain one).
    pub async fn answer(
        &self,
        limits: &Limits,
        engine: &Engine,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Refusal> {
        let id = format!(
            "{}-{}",
            self.cost_ids,
            self.costs.fetch_add(1, Ordering::Relaxed)
        );
        let mut lines = lines(limits, request, &self.prefix, &id)?;
        // The engine's step, as the wire's lines take it: the regions' refusals, the
        // operators' overrides. Only a check holds global limits (`lines` refuses them
        // elsewhere).
        let intake = engine.intake();
        for (intent, call) in [
            (Intent::Check, &mut lines.check),
            (Intent::Read, &mut lines.read),
            (Intent::Settle, &mut lines.cost),
            (Intent::Return, &mut lines.release),
        ] {
            intake.admit(intent, call).map_err(Refusal::Failed)?;
        }
        let (check, read, cost) = (&lines.check, &lines.read, &lines.cost);
        let release = &lines.release;
        let (checked, were, costed, released) = tokio::join!(
            run(!check.is_empty(), || engine.check(check)),
            run(!read.is_empty(), || engine.read(read)),
            run(!cost.is_empty(), || async {
                let mut settled = engine.settle_all(std::slice::from_ref(cost)).await;
                settled.pop().unwrap_or_else(|| Err("no answer".into()))
            }),
            run(!release.is_empty(), || async {
                let mut returned = engine.return_leases(std::slice::from_ref(release)).await;
                returned.pop().unwrap_or_else(|| Err("no answer".into()))
            }),
        );
        let (checked, were, costed, released) = (
            checked.map_err(Refusal::Failed)?,
            were.map_err(Refusal::Failed)?,
            costed.map_err(Refusal::Failed)?,
            released.map_err(Refusal::Failed)?,
        );
        let mut response = RateLimitResponse {
            overall_code: CODE_OK,
            ..RateLimitResponse::default()
        };
        let mut shown: Option<(&Rule, RuleOutcome)> = None;
        let metrics = &self.metrics;
        let later = later_hits(&lines.descriptors);
        let mut passed = Vec::new();
        for (line, later) in lines.descriptors.iter().zip(later) {
            let outcome = match line.ask {
                Ask::Free | Ask::Over => None,
                Ask::Check => checked.get(line.at).cloned().map(|mut o| {
                    if o.allowed {
                        o.remaining = o.remaining.saturating_add(later);
                    }
                    o
                }),
                // An ask (hits 0) is within down to exactly the limit, as envoyproxy/
                // ratelimit answers a counter at its limit: only debt is over.
                Ask::Read => were.get(line.at).cloned().map(|mut o| {
                    o.allowed = o.owed == 0;
                    o
                }),
                // A cost is within if the bucket paid all of it: it borrowed nothing, and
                // left no debt (`borrowed` counts whole tokens: a cost of 1 on 0.3 tokens
                // borrows 0.7, which is debt, as envoyproxy/ratelimit's counter at its
                // limit is over at one hit more). A give-back is never over.
                // A slot given back: the slots free after it.
                Ask::Release => released.get(line.at).cloned().map(|mut o| {
                    o.allowed = true;
                    o
                }),
                Ask::Cost => costed.get(line.at).cloned().map(|mut o| {
                    let took = (lines.cost.get(line.at))
                        .and_then(|spec| spec.settle.as_ref())
                        .is_some_and(|settle| settle.delta > 0);
                    o.allowed = o.borrowed == 0 && !(took && o.owed > 0);
                    o
                }),
            };
            let Some(rule) = line.rule.as_deref() else {
                response.statuses.push(DescriptorStatus {
                    code: CODE_OK,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            // A rule in shadow mode that lacked the hits is admitted, saying how long
            // enforcing it would have made the request wait.
            let over = line.ask == Ask::Over
                || outcome
                    .as_ref()
                    .is_some_and(|o| !o.allowed || (rule.shadow && o.wait_ms > 0));
            let became = match (over, rule.shadow || self.shadow) {
                (true, false) => Hits::Over,
                (true, true) => Hits::Shadow,
                (false, _) => Hits::Within {
                    near: near(rule, outcome.as_ref(), line.hits),
                },
            };
            metrics.hits(&rule.label, line.hits, became);
            // In shadow mode for the whole service, the descriptor still says it is over
            // (as envoyproxy/ratelimit's `SHADOW_MODE` answers): only the call is let through.
            let code = if over && !rule.shadow {
                if !self.shadow {
                    response.overall_code = CODE_OVER_LIMIT;
                }
                CODE_OVER_LIMIT
            } else {
                CODE_OK
            };
            let outcome = outcome.unwrap_or(RuleOutcome {
                allowed: !over,
                ..RuleOutcome::default()
            });
            if code == CODE_OK && rule.quota != Quota::Unlimited {
                passed.extend(rule.metadata.as_ref());
            }
            response.statuses.push(DescriptorStatus {
                code,
                current_limit: (rule.quota != Quota::Unlimited).then(|| RateLimit {
                    requests_per_unit: rule.requests_per_unit,
                    unit: rule.unit,
                    name: rule.name.clone(),
                }),
                // As envoyproxy/ratelimit answers an unlimited descriptor.
                limit_remaining: match rule.quota {
                    Quota::Unlimited => u32::MAX,
                    _ => u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
                },
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
        if let Some((rule, outcome)) = shown {
            response.response_headers_to_add = match self.headers.kind {
                ResponseHeaders::Off => Vec::new(),
                ResponseHeaders::Draft03 => {
                    let refused = response.overall_code == CODE_OVER_LIMIT;
                    draft03(rule, &outcome, refused)
                }
                ResponseHeaders::Reference => reference(&self.headers, rule, &outcome),
            };
        }
        let mut metadata = self.dynamic_metadata.then(|| dynamic::of(request, &passed));
        if let Some(taken) = reserved(&lines.descriptors, &checked) {
            let fields = &mut metadata.get_or_insert_with(Struct::default).fields;
            fields.insert(RESERVED.into(), Value::string(taken.to_string()));
        }
        response.dynamic_metadata = metadata;
        Ok(response)
    }
}

/// What the call's reservations took, if it holds any under a limit: the hits of each, if
/// the check that held them was admitted whole and its bucket paid (a shadow rule that
/// lacked them took nothing), else 0; of several, the least, so that no commit naming it
/// gives back more than its own bucket took.
fn reserved(descriptors: &[DescriptorLine], checked: &[RuleOutcome]) -> Option<u64> {
    let admitted = checked.iter().all(|o| o.allowed);
    descriptors
        .iter()
        .filter(|p| p.reserves && p.rule.is_some() && p.ask != Ask::Free)
        .map(|p| match (p.ask, checked.get(p.at)) {
            (Ask::Check, Some(o)) if admitted && o.wait_ms == 0 => p.hits,
            _ => 0,
        })
        .min()
}

/// For each descriptor, the hits of those after it in the same bucket of the check (the
/// same descriptor twice in one call): an admitted one's status then says the level after
/// its own hits, as envoyproxy/ratelimit's do (9, then 8), not after all of them.
fn later_hits(descriptors: &[DescriptorLine]) -> Vec<u64> {
    let same = |p: &DescriptorLine, q: &DescriptorLine| {
        p.ask == Ask::Check && q.ask == p.ask && q.at == p.at
    };
    let after = |(i, p): (usize, &DescriptorLine)| {
        if p.ask != Ask::Check {
            return 0;
        }
        let rest = descriptors.iter().skip(i + 1).filter(|q| same(p, q));
        rest.map(|q| q.hits).fold(0, u64::saturating_add)
    };
    descriptors.iter().enumerate().map(after).collect()
}

/// Of `hits` within the limit, how many took its use past `floor(0.8 x limit)`, as
/// envoyproxy/ratelimit counts them near the limit: all of them if it was past already.
fn near(rule: &Rule, outcome: Option<&RuleOutcome>, hits: u64) -> u64 {
    let (Quota::Bucket(limit), Some(o)) = (rule.quota, outcome) else {
        return 0;
    };
    let threshold = limit.burst.saturating_mul(4) / 5;
    let used = limit.burst.saturating_sub(o.remaining);
    used.saturating_sub(threshold).min(hits)
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

/// `X-RateLimit-*` of the tightest limit, as Envoy's own draft-03 headers read, and
/// `Retry-After` if the call is `refused`.
fn draft03(rule: &Rule, outcome: &RuleOutcome, refused: bool) -> Vec<HeaderValue> {
    let window_s = unit_ms(rule.unit).map_or(1, |ms| ms / 1000);
    let n = rule.requests_per_unit;
    let seconds = |ms: u64| ms.div_ceil(1000).to_string();
    let mut headers = vec![
        header("x-ratelimit-limit", format!("{n}, {n};w={window_s}")),
        header("x-ratelimit-remaining", outcome.remaining.to_string()),
        header("x-ratelimit-reset", seconds(outcome.full_ms)),
    ];
    if refused && !outcome.allowed {
        headers.push(header("retry-after", seconds(outcome.wait_ms.max(1))));
    }
    headers
}

/// envoyproxy/ratelimit's headers of the tightest limit: the requests per unit alone (no
/// quota policy, as it writes it), the tokens left, and whole seconds until the bucket is
/// full again (its own: until its fixed window ends).
fn reference(names: &Headers, rule: &Rule, outcome: &RuleOutcome) -> Vec<HeaderValue> {
    vec![
        header(&names.limit, rule.requests_per_unit.to_string()),
        header(&names.remaining, outcome.remaining.to_string()),
        header(&names.reset, outcome.full_ms.div_ceil(1000).to_string()),
    ]
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
    }
}
