//! A rule's `meter`: a cost known only from the response (an LLM API's tokens), reserved
//! when the request is checked and settled when the response ends. What the configuration
//! may say, checked against the rule's limit; reading the response is the filter's
//! `metering`, and the settlement the script's `settle` mode.
//!
//! ```json
//! "meter": {
//!   "usage": "openai-chat", "weights": {"input": 1, "output": 4, "cached_input": 0},
//!   "body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 4},  (or, for any API)
//!   "header": "x-usage-tokens",
//!   "reserve": {"header": "x-max-tokens", "body": ["max_tokens", "max_completion_tokens"],
//!               "default": 500, "max": 4000},
//!   "debt": 20000
//! }
//! ```

use crate::body_field::field_path;
use crate::error::{err, ConfigError};
use crate::limit::{Limit, MAX_EXACT};
use crate::source::validate_header_name;
use crate::usage;
pub use crate::usage::{MeteredField, MAX_WEIGHT};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Most fields a meter reads from a body.
pub const MAX_FIELDS: usize = 16;
/// Most fields of the request body a reservation reads.
pub const MAX_RESERVE_FIELDS: usize = 4;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMeter {
    #[serde(default)]
    body: BTreeMap<String, i64>,
    usage: Option<String>,
    weights: Option<BTreeMap<String, i64>>,
    header: Option<String>,
    reserve: RawReserve,
    debt: Option<u64>,
    include_usage: Option<bool>,
}

#[derive(Deserialize, Debug)]
#[serde(
    untagged,
    expecting = "reserve: a number of tokens, or {\"header\": ..., \"body\": [...], \"default\": ..., \"max\": ...}"
)]
enum RawReserve {
    Fixed(u64),
    Asked(RawReserveAsked),
}

/// A reservation the request asks for, in a header or fields of its JSON body.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RawReserveAsked {
    header: Option<String>,
    body: Option<Vec<String>>,
    default: u64,
    max: Option<u64>,
}

/// A validated meter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterPolicy {
    /// Fields of a JSON body, or of a server-sent event's JSON (`text/event-stream`): the
    /// `body` paths, or those of a `usage` format.
    pub body: Vec<MeteredField>,
    /// A response header holding the cost in tokens; when the response has it, it decides.
    pub header: Option<String>,
    /// What a request reserves when it says nothing (or when no header is named).
    pub reserve: u64,
    /// A request header asking for a reservation (an LLM request's `max_tokens`).
    pub reserve_header: Option<String>,
    /// Fields of the request's JSON body asking for a reservation (`max_tokens`,
    /// `max_completion_tokens`): the request waits for its body to be checked.
    pub reserve_body: Vec<Vec<String>>,
    /// The most a request may reserve through `reserve_header` or `reserve_body`.
    pub max_reserve: u64,
    /// How many tokens below 0 a settlement may take the bucket: by default as deep as
    /// the exact arithmetic goes (`deepest_debt`), so that what a response cost is owed in
    /// full whatever parallel requests of one key ran up.
    pub debt: u64,
    /// A streamed chat completion that does not ask for its usage is made to
    /// (`stream_options.include_usage` added to its body): OpenAI's streams report none
    /// unless asked.
    pub include_usage: bool,
}

/// The deepest debt a bucket of `limit` can hold exactly: `(burst + debt) x den` below
/// 2^53 (trillions of tokens for any practical limit).
pub fn deepest_debt(limit: &Limit) -> u64 {
    ((MAX_EXACT - 1) / limit.den.max(1)).saturating_sub(limit.burst)
}

impl MeterPolicy {
    /// Every path the fields read, field by field: what a reader of the body looks for,
    /// its values in this order.
    pub fn paths(&self) -> Vec<Vec<String>> {
        (self.body.iter())
            .flat_map(|f| f.paths.iter().cloned())
            .collect()
    }

    /// Each field's count out of the values at `paths()` (the largest of its paths').
    fn counts(&self, values: &[Option<u64>]) -> Vec<Option<u64>> {
        let mut at = 0;
        (self.body.iter())
            .map(|f| {
                let of = values.get(at..at + f.paths.len()).unwrap_or_default();
                at += f.paths.len();
                of.iter().flatten().copied().max()
            })
            .collect()
    }

    /// The cost a response measured from the values at `paths()` (`None`: never seen), at
    /// least 0; `None` if no field was seen at all, or a field is more than the one it is
    /// some of (counts that contradict each other are no measure).
    pub fn cost_of(&self, values: &[Option<u64>]) -> Option<u64> {
        let counts = self.counts(values);
        let mut total: i128 = 0;
        for (field, count) in self.body.iter().zip(&counts) {
            let n = i128::from(count.unwrap_or(0));
            total += i128::from(field.weight) * n;
            if let Some(of) = field.within {
                let whole = counts.get(of).copied().flatten().unwrap_or(0);
                if n > i128::from(whole) {
                    return None;
                }
                let replaced = self.body.get(of).map_or(0, |f| f.weight);
                total -= i128::from(replaced) * n;
            }
        }
        counts
            .iter()
            .any(Option::is_some)
            .then(|| u64::try_from(total.max(0)).unwrap_or(u64::MAX))
    }

    /// What the values at `paths()` prove a response cost at least, when they cannot be
    /// trusted to be all it said: each field that is not some of another at its largest,
    /// at the highest positive weight of it and of those within it (a discount it may not
    /// have earned is not given), 0 if none was seen.
    pub fn at_least(&self, values: &[Option<u64>]) -> u64 {
        let counts = self.counts(values);
        let total: u128 = (self.body.iter().enumerate().zip(&counts))
            .filter(|((_, field), _)| field.within.is_none())
            .filter_map(|((i, field), count)| {
                let inner = self.body.iter().filter(|f| f.within == Some(i));
                let weight = inner.map(|f| f.weight).fold(field.weight, i64::max);
                Some(u128::try_from(weight).ok()? * u128::from((*count)?))
            })
            .sum();
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

impl RawMeter {
    /// The meter at `field` of a rule of `limit`, whose tiers have `tiers` (checked
    /// against the meter with `fits`).
    pub(crate) fn validate<'a>(
        self,
        field: &str,
        limit: &Limit,
        tiers: impl IntoIterator<Item = &'a Limit>,
    ) -> Result<MeterPolicy, ConfigError> {
        if self.body.is_empty() && self.usage.is_none() && self.header.is_none() {
            return err(
                field,
                "names nothing to read: give a usage format, body fields or a header",
            );
        }
        if self.usage.is_some() && !self.body.is_empty() {
            return err(
                format!("{field}.body"),
                "a usage format or body fields, not both",
            );
        }
        if self.usage.is_none() && self.weights.is_some() {
            return err(
                format!("{field}.weights"),
                "weighs a usage format's classes: give usage",
            );
        }
        if self.body.len() > MAX_FIELDS {
            return err(
                format!("{field}.body"),
                format!("at most {MAX_FIELDS} fields"),
            );
        }
        let mut body = Vec::with_capacity(self.body.len());
        for (path, weight) in self.body {
            let at = format!("{field}.body.{path}");
            let segments = field_path(&at, &path)?;
            if weight == 0 || weight.abs() > MAX_WEIGHT {
                return err(
                    at,
                    format!("a weight is an integer from -{MAX_WEIGHT} to {MAX_WEIGHT}, not 0"),
                );
            }
            body.push(MeteredField {
                paths: vec![segments],
                weight,
                within: None,
            });
        }
        if !body.is_empty() && body.iter().all(|f| f.weight < 0) {
            return err(format!("{field}.body"), "needs a field of positive weight");
        }
        if let Some(name) = &self.usage {
            body = usage::fields(field, name, &self.weights.unwrap_or_default())?;
        }
        let include_usage = self.include_usage.unwrap_or(false);
        if include_usage && self.usage.as_deref() != Some(usage::INCLUDES_USAGE) {
            return err(
                format!("{field}.include_usage"),
                format!(
                    "asks a stream for its usage as OpenAI's Chat Completions take the ask: \
                     needs \"usage\": \"{}\"",
                    usage::INCLUDES_USAGE
                ),
            );
        }
        let header = match self.header {
            Some(name) => Some(validate_header_name(&format!("{field}.header"), &name)?),
            None => None,
        };
        let burst = limit.burst;
        let within = |at: String, n: u64, name: &str| {
            if (1..=burst).contains(&n) {
                Ok(n)
            } else {
                err(at, format!("{name} must be 1 to the burst ({burst})"))
            }
        };
        let (reserve, reserve_header, reserve_body, max_reserve) = match self.reserve {
            RawReserve::Fixed(n) => {
                let n = within(format!("{field}.reserve"), n, "a reserve")?;
                (n, None, Vec::new(), n)
            }
            RawReserve::Asked(raw) => {
                let at = format!("{field}.reserve");
                let header = match raw.header {
                    Some(name) => Some(validate_header_name(&format!("{at}.header"), &name)?),
                    None => None,
                };
                let body = reserve_fields(&format!("{at}.body"), raw.body.unwrap_or_default())?;
                if header.is_none() && body.is_empty() {
                    return err(
                        at,
                        "asks nothing: give a header or body fields, or a number",
                    );
                }
                let max = within(format!("{at}.max"), raw.max.unwrap_or(burst), "max")?;
                if !(1..=max).contains(&raw.default) {
                    return err(format!("{at}.default"), format!("must be 1 to max ({max})"));
                }
                (raw.default, header, body, max)
            }
        };
        let deepest = tiers.into_iter().map(deepest_debt).min();
        let debt =
            (self.debt).unwrap_or_else(|| deepest_debt(limit).min(deepest.unwrap_or(u64::MAX)));
        let span = u128::from(burst) + u128::from(debt);
        if span * u128::from(limit.den) >= u128::from(MAX_EXACT) {
            return err(
                format!("{field}.debt"),
                "too large for this limit's exact arithmetic: (burst + debt) x its units \
                 must stay below 2^53",
            );
        }
        Ok(MeterPolicy {
            body,
            header,
            reserve,
            reserve_header,
            reserve_body,
            max_reserve,
            debt,
            include_usage,
        })
    }
}

/// The request body's fields a reservation reads (at `at`): at most
/// `MAX_RESERVE_FIELDS`, each named once.
fn reserve_fields(at: &str, paths: Vec<String>) -> Result<Vec<Vec<String>>, ConfigError> {
    if paths.len() > MAX_RESERVE_FIELDS {
        return err(at, format!("at most {MAX_RESERVE_FIELDS} fields"));
    }
    let mut fields = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let segments = field_path(&format!("{at}[{i}]"), path)?;
        if fields.contains(&segments) {
            return err(format!("{at}[{i}]"), "names a field twice");
        }
        fields.push(segments);
    }
    Ok(fields)
}

impl MeterPolicy {
    /// Whether this meter also fits `limit` (a tier's), at `field`: its reservations within
    /// the burst, its debt within the exact arithmetic.
    pub(crate) fn fits(&self, field: &str, limit: &Limit) -> Result<(), ConfigError> {
        if self.max_reserve > limit.burst {
            return err(
                field,
                format!(
                    "the meter reserves up to {} tokens, more than this burst ({})",
                    self.max_reserve, limit.burst
                ),
            );
        }
        let span = u128::from(limit.burst) + u128::from(self.debt);
        if span * u128::from(limit.den) >= u128::from(MAX_EXACT) {
            return err(field, "the meter's debt is too large for this limit");
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "meter_tests.rs"]
mod tests;
