//! What one `ShouldRateLimit` call asks of which bucket: each descriptor's limit found in
//! the configuration (or the caller's override), and its hits sorted into the script calls
//! that run them.
//!
//! Hits come in kinds, as Envoy sends them:
//! - the request's own (`hits_addend` of the request, 1 when unset) are a **check**: the
//!   descriptors' buckets are asked together, all or nothing, and a refused request takes
//!   nothing, so clients held at the limit do not drain it further;
//! - a descriptor's own `hits_addend` (what Envoy Gateway's `cost` and AI Gateway's token
//!   usage send, at the request and with `apply_on_stream_done`) is a **cost**: 0 only asks
//!   whether the bucket is in debt (at exactly its limit, within, as envoyproxy/ratelimit
//!   answers a counter at its limit); more is taken in full, past 0 down to one bucket of
//!   debt, and the answer is over the limit if the bucket could not pay it. A cost reported
//!   after the response is thus never lost to a bucket that ran low meanwhile;
//! - a **reservation** and its **commit**, marked by a last entry the lookup never sees:
//!   `ratelimit.reserve` (any value) makes the descriptor's hits, its own or the request's,
//!   a check, all or nothing; `ratelimit.reserved: N` makes its own hits (the usage) settle
//!   against the N reserved: the difference is taken, into debt if need be, or given back.
//!   N is read as Envoy reads a number of hits (`hits::envoy_hits`), and what Envoy would
//!   not have reserved from it reads as 0: a commit is never refused, and never gives back
//!   more than a reservation made from the same text took. The answer to a reservation
//!   says what it took (`answer`), for the commit to name instead of a client's header;
//! - an in-flight limit's **slot** and its **release**, marked so too: `ratelimit.slot: ID`
//!   takes the request's slot in the check, all or nothing; `ratelimit.release: ID` (sent
//!   at the stream's end) gives it back. The slot is named by a digest of ID (Envoy's
//!   `x-request-id`), so any value names one; an ID held already is refused, so a client
//!   that reuses a live request's ID runs without a slot of its own only by being refused.

use super::hits::envoy_hits;
use super::limits::{Limits, Quota, Rule};
use super::metrics::RuleLabel;
use super::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
use super::raw::unit_ms;
use crate::store::check::{Check, RuleSpec};
use ratelimit_config::digest::sha256_hex;
use ratelimit_config::in_flight::InFlight;
use ratelimit_config::keys::{bucket_key, key_safe, SERVICE_RULE};
use ratelimit_config::limit::Limit;
use ratelimit_protocol::slot::Slot;
use ratelimit_protocol::{Settle, MAX_EXACT, MAX_RULES};
use std::sync::Arc;

/// Descriptors in one call, and entries in one descriptor: Envoy sends a handful, and
/// envoyproxy/ratelimit bounds neither; these bound only the work a hostile call makes. Of
/// them, at most `MAX_RULES` buckets of each kind (checked, read, costed) in one call: a
/// check is one all-or-nothing script call of at most that many.
pub const MAX_DESCRIPTORS: usize = 1024;
pub const MAX_ENTRIES: usize = 16;
/// The last entry of a reservation, and of its commit (its value: the hits reserved).
pub const RESERVE: &str = "ratelimit.reserve";
pub const RESERVED: &str = "ratelimit.reserved";
/// The last entry of an in-flight limit's take, and of its release (their value: the
/// request's id).
pub const SLOT: &str = "ratelimit.slot";
pub const RELEASE: &str = "ratelimit.release";

/// What is asked of a descriptor's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// No limit applies: within.
    Free,
    /// Over without asking Redis: a limit of 0, or hits no full bucket holds.
    Over,
    /// In the check, all or nothing (`Lines::check`).
    Check,
    /// Read only (`Lines::read`).
    Read,
    /// Settled on its own (`Lines::cost`).
    Cost,
    /// A slot given back (`Lines::release`).
    Release,
}

/// One descriptor's part of the call.
pub struct DescriptorLine {
    pub rule: Option<Arc<Rule>>,
    pub ask: Ask,
    pub hits: u64,
    /// Index of its rule in the call of its kind.
    pub at: usize,
    /// A reservation (`ratelimit.reserve`): what it took is said in the answer.
    pub reserves: bool,
}

/// The call's descriptors, and the lines (one script call each) that run them.
#[derive(Default)]
pub struct Lines {
    pub descriptors: Vec<DescriptorLine>,
    pub check: Check,
    pub read: Check,
    /// Costs and commits: a settlement, under one id per call.
    pub cost: Check,
    /// Slots released: a lease return.
    pub release: Check,
}

/// Why a call was not answered.
#[derive(Debug)]
pub enum Refusal {
    /// The caller's input: `INVALID_ARGUMENT`.
    Invalid(String),
    /// Redis: `UNAVAILABLE`, and Envoy applies its failure mode.
    Failed(String),
}

/// A descriptor's entries without its marker, the marker, and the limit found for them.
type Looked<'a> = (&'a [Entry], Marker, Option<Arc<Rule>>);

/// What a descriptor's last entry says of it.
enum Marker {
    None,
    Reserve,
    Reserved(u64),
    /// An in-flight limit's slot taken, and released: the slot's id.
    Slot(String),
    Release(String),
}

/// `request` turned into lines against `limits`, its buckets keyed under `prefix`, its costs settled
/// under `cost_id` (unique per call).
pub fn lines(
    limits: &Limits,
    request: &RateLimitRequest,
    prefix: &str,
    cost_id: &str,
) -> Result<Lines, Refusal> {
    let domain = request.domain.as_str();
    if domain.is_empty() {
        return Err(Refusal::Invalid(
            "rate limit domain must not be empty".into(),
        ));
    }
    // As envoyproxy/ratelimit refuses it: a call about nothing is a caller's mistake, and
    // Envoy's failure mode decides it.
    if request.descriptors.is_empty() {
        return Err(Refusal::Invalid(
            "rate limit descriptor list must not be empty".into(),
        ));
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
    let read: Vec<Looked> = request
        .descriptors
        .iter()
        .map(|d| {
            let (entries, marker) = marked(&d.entries)?;
            Ok((entries, marker, rule_of(limits, domain, entries, d)?))
        })
        .collect::<Result<_, Refusal>>()?;
    let replaced: Vec<String> = read
        .iter()
        .filter_map(|(_, _, rule)| rule.as_deref())
        .flat_map(|r| r.replaces.iter().cloned())
        .collect();
    let mut lines = Lines::default();
    for (descriptor, (entries, marker, rule)) in request.descriptors.iter().zip(read) {
        let rule = rule.filter(|r| r.name.is_empty() || !replaced.contains(&r.name));
        let own = descriptor.hits_addend.as_ref().map(|h| h.value);
        let hits = own.unwrap_or(wide_hits).min(MAX_EXACT - 1);
        let (limit, found) = match rule.as_deref().map(|r| (r.quota, r)) {
            Some((Quota::Bucket(limit), found)) => (limit, found),
            Some((Quota::Slots(in_flight), found)) => {
                let line = slot_line(
                    &mut lines, prefix, domain, entries, found, in_flight, marker,
                )?;
                lines.descriptors.push(DescriptorLine { rule, ..line });
                continue;
            }
            // Answered without Redis: no limit, or a limit of 0.
            other => {
                let ask = match other {
                    Some((Quota::Blocked, _)) => Ask::Over,
                    _ => Ask::Free,
                };
                lines.descriptors.push(DescriptorLine {
                    rule,
                    ask,
                    hits,
                    at: 0,
                    reserves: false,
                });
                continue;
            }
        };
        if found.global.is_some() && (own.is_some() || !matches!(marker, Marker::None)) {
            return Err(Refusal::Invalid(format!(
                "descriptor {} is a global limit: only the request's hits are checked \
                 against it (a descriptor's own hits_addend, a reservation or a commit are \
                 not supported yet)",
                found.label.key
            )));
        }
        let reserves = matches!(marker, Marker::Reserve);
        let (ask, at) = match (marker, own) {
            (Marker::Reserved(reserved), Some(_)) => {
                let delta = signed(hits) - signed(reserved);
                let spec = settlement(prefix, domain, entries, found, &limit, delta, cost_id);
                (Ask::Cost, place(&mut lines.cost, spec))
            }
            (Marker::Reserved(_), None) => {
                return Err(Refusal::Invalid(format!(
                    "a descriptor ending in {RESERVED} has no hits_addend (the usage)"
                )))
            }
            (Marker::Slot(_) | Marker::Release(_), _) => {
                return Err(Refusal::Invalid(format!(
                    "descriptor {} ends in {SLOT} or {RELEASE}, but its limit is no in_flight",
                    found.label.key
                )))
            }
            (Marker::None | Marker::Reserve, Some(0)) => {
                let spec = spec(prefix, domain, entries, found, &limit, 1);
                (Ask::Read, place(&mut lines.read, spec))
            }
            (Marker::None, Some(_)) => {
                let delta = signed(hits);
                let spec = settlement(prefix, domain, entries, found, &limit, delta, cost_id);
                (Ask::Cost, place(&mut lines.cost, spec))
            }
            (Marker::Reserve, _) | (Marker::None, None) if hits > limit.burst => (Ask::Over, 0),
            (Marker::Reserve, _) | (Marker::None, None) => {
                let spec = spec(prefix, domain, entries, found, &limit, hits);
                (Ask::Check, place(&mut lines.check, spec))
            }
        };
        lines.descriptors.push(DescriptorLine {
            rule,
            ask,
            hits,
            at,
            reserves,
        });
        // Refused as soon as it passes the bound: `place` looks through a call's buckets.
        if [&lines.check, &lines.read, &lines.cost, &lines.release]
            .iter()
            .any(|call| call.len() > MAX_RULES)
        {
            return Err(Refusal::Invalid(format!(
                "more than {MAX_RULES} limited descriptors of one kind in one call"
            )));
        }
    }
    Ok(lines)
}

/// An in-flight limit's descriptor: its slot taken in the check, or released; with no slot
/// id (a configuration that sends none), over the limit, never let through unlimited.
fn slot_line(
    lines: &mut Lines,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    found: &Rule,
    in_flight: InFlight,
    marker: Marker,
) -> Result<DescriptorLine, Refusal> {
    let limit = in_flight
        .limit()
        .map_err(|(_, why)| Refusal::Invalid(why))?;
    let slotted = |id: String| RuleSpec {
        slot: Some(Slot {
            ttl_ms: in_flight.ttl_ms,
            id,
        }),
        ..spec(prefix, domain, entries, found, &limit, 1)
    };
    let (ask, hits, at) = match marker {
        Marker::Slot(id) => (Ask::Check, 1, place(&mut lines.check, slotted(id))),
        Marker::Release(id) => (Ask::Release, 0, place(&mut lines.release, slotted(id))),
        _ => (Ask::Over, 1, 0),
    };
    Ok(DescriptorLine {
        rule: None,
        ask,
        hits,
        at,
        reserves: false,
    })
}

/// Puts `spec` in `call`, returning its index: a bucket already there (the same descriptor
/// twice in one call, which the script must never see twice in one check) takes the hits
/// or the delta of both, as two calls would.
fn place(call: &mut Check, spec: RuleSpec) -> usize {
    let Some(at) = call.iter().position(|r| r.key == spec.key) else {
        call.push(spec);
        return call.len() - 1;
    };
    if let Some(first) = call.get_mut(at) {
        first.cost = first.cost.saturating_add(spec.cost).min(MAX_EXACT - 1);
        if let (Some(first), Some(more)) = (&mut first.settle, spec.settle) {
            let bound = signed(MAX_EXACT - 1);
            first.delta = (first.delta + more.delta).clamp(-bound, bound);
        }
    }
    at
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The entries the lookup and the key see, and what the last one marks.
fn marked(entries: &[Entry]) -> Result<(&[Entry], Marker), Refusal> {
    if entries.len() > MAX_ENTRIES {
        return Err(Refusal::Invalid(format!(
            "a descriptor has more than {MAX_ENTRIES} entries"
        )));
    }
    let Some((last, rest)) = entries.split_last() else {
        return Ok((entries, Marker::None));
    };
    match last.key.as_str() {
        RESERVE => Ok((rest, Marker::Reserve)),
        RESERVED => {
            let reserved = envoy_hits(&last.value).unwrap_or(0);
            Ok((rest, Marker::Reserved(reserved.min(MAX_EXACT - 1))))
        }
        SLOT => Ok((rest, Marker::Slot(sha256_hex(last.value.as_bytes())))),
        RELEASE => Ok((rest, Marker::Release(sha256_hex(last.value.as_bytes())))),
        _ => Ok((entries, Marker::None)),
    }
}

/// The descriptor's limit: the caller's override, in the configured descriptor's place if
/// there is one, or the configured limit.
fn rule_of(
    limits: &Limits,
    domain: &str,
    entries: &[Entry],
    descriptor: &RateLimitDescriptor,
) -> Result<Option<Arc<Rule>>, Refusal> {
    let found = limits.find(
        domain,
        entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
    );
    // As envoyproxy/ratelimit: no limit at all in a domain it does not configure, not even
    // the caller's own.
    let (Some(wanted), true) = (&descriptor.limit, limits.configures(domain)) else {
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
            label: RuleLabel {
                domain: domain.to_owned(),
                key: "override".into(),
            },
            name: String::new(),
            quota,
            requests_per_unit: 0,
            unit: 0,
            shadow: false,
            replaces: Vec::new(),
            shared: Vec::new(),
            metadata: None,
            global: None,
        },
        |r| Rule::clone(r),
    );
    // An override is a limit of the caller's, carrying none of the configured one's
    // metadata, as envoyproxy/ratelimit makes it.
    rule.metadata = None;
    rule.quota = quota;
    rule.requests_per_unit = wanted.requests_per_unit;
    rule.unit = wanted.unit;
    Ok(Some(Arc::new(rule)))
}

/// A value in a key: escaped, and the empty value as the digest of nothing (a digest no
/// escaped value equals).
fn value(text: &str) -> String {
    key_safe(text.as_bytes()).map_or_else(|| format!("#{}", sha256_hex(b"")), Into::into)
}

/// The key of `domain`'s bucket for `parts`, a descriptor's entries as the key holds them
/// (each key, then its value or its shared pattern); fewer of them name what an operator's
/// override covers (`overrides::Table::find`).
pub fn bucket_of<'a>(
    prefix: &str,
    domain: &str,
    parts: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut values = vec![value(domain)];
    values.extend(parts.into_iter().map(value));
    bucket_key(prefix, SERVICE_RULE, &values)
}

/// The rule of a descriptor's bucket, as the script takes it.
pub fn spec(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    rule: &Rule,
    limit: &Limit,
    cost: u64,
) -> RuleSpec {
    let parts = entries.iter().enumerate().flat_map(|(i, entry)| {
        let shared = rule.shared.iter().find(|(at, _)| *at == i);
        [
            entry.key.as_str(),
            shared.map_or(entry.value.as_str(), |(_, p)| p.as_str()),
        ]
    });
    let key = bucket_of(prefix, domain, parts);
    let mut spec = RuleSpec::plain(key, limit.burst, limit.num, limit.den, cost);
    spec.shadow = rule.shadow;
    spec.global.clone_from(&rule.global);
    spec
}

/// `delta` hits taken from (or, below 0, given back to) the descriptor's bucket, down to
/// one bucket of debt.
fn settlement(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    rule: &Rule,
    limit: &Limit,
    delta: i64,
    id: &str,
) -> RuleSpec {
    let mut spec = spec(prefix, domain, entries, rule, limit, 0);
    spec.settle = Some(Settle {
        delta,
        debt: limit.burst,
        id: id.to_owned(),
    });
    spec
}

#[cfg(test)]
#[path = "lines_tests.rs"]
mod tests;
