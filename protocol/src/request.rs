//! The request side: the filter encodes one line per check, the bridge parses them
//! strictly. A bad line fails only its own check; only a body that cannot be read as a
//! batch at all fails the exchange.

use crate::bounds::{MAX_BODY, MAX_CHECKS, MAX_EXACT, MAX_KEY_LEN, MAX_RULES};
use crate::calendar::{encode_calendar, parse_calendar, Bounds, Calendar, Period, CALENDAR_MARK};
use crate::global::{encode_global, parse_global, Global, GLOBAL_MARK};
pub use crate::id::{valid_settlement_id, MAX_SETTLEMENT_ID_LEN};
use crate::number::push_u64;
use crate::slot::{encode_slot, parse_slot, Slot, SLOT_MARK};
use crate::split;
use std::fmt;
use std::sync::Arc;

/// One rule of a check: the bucket and how it fills and drains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub key: String,
    /// Capacity in tokens.
    pub burst: u64,
    /// Refill: `num` units per millisecond, one token being `den` units.
    pub num: u64,
    pub den: u64,
    /// Tokens this request takes.
    pub cost: u64,
    /// Tokens more the check would like to take as a lease, if the bucket holds them
    /// beyond the cost (0: none).
    pub lease: u64,
    /// When the bucket's client is blocked after repeated denials.
    pub block: Option<Block>,
    /// A rule in shadow mode: it never denies its check; lacking the cost, it takes
    /// nothing and says what enforcing it would have answered.
    pub shadow: bool,
    /// The emergency override in force for this bucket, which the bridge adds (never on
    /// the wire): its own bucket decides instead of this one.
    pub overridden: Option<Overridden>,
    /// On a settlement's line (then `cost` and `lease` are 0): what it does to the bucket.
    pub settle: Option<Settle>,
    /// A global rule's terms: its budget is one across regions (`global`).
    pub global: Option<Global>,
    /// An in-flight rule's slot for this request (`slot`): the key names a set of slots,
    /// `burst` of them at most, and `cost` is 1.
    pub slot: Option<Slot>,
    /// A calendar quota's period (`calendar`): its rate is `0,1`, it refills at once at each
    /// period's start.
    pub calendar: Option<Calendar>,
    /// The instants of its periods, which the bridge adds (never on the wire) for the
    /// script to pick from.
    pub bounds: Option<Bounds>,
    /// The name of the client's plan whose limit the bridge put on the rule in place of
    /// the one sent (never on the wire).
    pub plan: Option<Arc<str>>,
}

/// A metered rule's settlement on one bucket: the usage its response measured minus what
/// its check reserved, applied once (`id`) however often it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Settle {
    /// Tokens taken (extra usage; taken even past 0, down to `-debt`) or, below 0, given
    /// back (an unused reservation, up to the capacity).
    pub delta: i64,
    /// How many tokens below 0 the bucket may go.
    pub debt: u64,
    /// The settlement's id, the same on each of its rules (`valid_settlement_id`).
    pub id: String,
}

/// An emergency override's bucket on a rule (`bridge/src/engine/overrides/` puts it there,
/// `lua/token_bucket.lua` runs it). While it is in force it decides the rule's checks and
/// the rule's own bucket is still charged what it admits, down to 0 at most: when it ends,
/// the client is where its rule would have left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Overridden {
    /// Capacity in tokens.
    pub burst: u64,
    /// Refill: `num` units per millisecond, one token being `den` units.
    pub num: u64,
    pub den: u64,
    /// The Redis time (ms) the override ends: after it the rule's bucket decides again,
    /// and it tells this override's bucket from an earlier one's in the stored value.
    pub until_ms: u64,
}

/// One line of a batch: its kind, then its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub kind: LineKind,
    pub rules: Vec<RuleSpec>,
}

/// What a line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineKind {
    /// Take each rule's cost, all or nothing.
    Check,
    /// Give each rule's cost back: tokens a lease did not use (`+ ` before the rules).
    LeaseReturn,
    /// Apply each rule's `settle` (`= ID ` before the rules): each bucket on its own, once.
    Settlement,
}

/// A rule's automatic block: a client denied `after` times within `within_ms` (counted
/// from the first of them) is blocked for `for_ms`. All three at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    pub after: u64,
    pub within_ms: u64,
    pub for_ms: u64,
}

/// One rule of a line, borrowed: the one input of `encode_rule`, whichever side holds the
/// rule: a parsed `RuleSpec` (`RuleSpec::spec_ref`) or the filter's planned rule
/// (`PlannedRule::spec_ref`). `RuleSpec`'s fields (see there) but `overridden`, which
/// never travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleSpecRef<'a> {
    pub key: &'a str,
    pub burst: u64,
    pub num: u64,
    pub den: u64,
    pub cost: u64,
    pub lease: u64,
    pub block: Option<Block>,
    pub shadow: bool,
    pub settle: Option<&'a Settle>,
    pub global: Option<&'a Global>,
    pub slot: Option<&'a Slot>,
    pub calendar: Option<(Period, &'a str)>,
}

impl RuleSpec {
    /// An enforced rule that leases nothing and never blocks.
    pub fn plain(key: impl Into<String>, burst: u64, num: u64, den: u64, cost: u64) -> RuleSpec {
        RuleSpec {
            key: key.into(),
            burst,
            num,
            den,
            cost,
            lease: 0,
            block: None,
            shadow: false,
            overridden: None,
            settle: None,
            global: None,
            slot: None,
            calendar: None,
            bounds: None,
            plan: None,
        }
    }

    /// This rule as a line carries it (`encode_rule`).
    pub fn spec_ref(&self) -> RuleSpecRef<'_> {
        RuleSpecRef {
            key: &self.key,
            burst: self.burst,
            num: self.num,
            den: self.den,
            cost: self.cost,
            lease: self.lease,
            block: self.block,
            shadow: self.shadow,
            settle: self.settle.as_ref(),
            global: self.global.as_ref(),
            slot: self.slot.as_ref(),
            calendar: self.calendar.as_ref().map(|c| (c.period, c.zone.as_str())),
        }
    }
}

/// How a line that returns tokens starts.
pub const LEASE_RETURN_MARK: &str = "+ ";

/// Starts a line that returns tokens (see `Line`); its rules follow.
pub fn start_lease_return(body: &mut String) {
    body.push_str(LEASE_RETURN_MARK);
}

/// How a settlement's line starts, its id and a space following.
pub const SETTLEMENT_MARK: &str = "= ";

/// Starts a settlement's line (see `Line`); its rules follow, each with its `settle`.
pub fn start_settlement(body: &mut String, id: &str) {
    body.push_str(SETTLEMENT_MARK);
    body.push_str(id);
    body.push(' ');
}

/// Appends one rule to the current line (`key,burst,num,den,cost`, the key preceded by `~`
/// for a rule in shadow mode, the cost followed by `+lease` when the check would take a
/// lease, or for a settlement `delta,debt` in its place, then `,after,within_ms,for_ms`
/// for a rule that blocks, then `^home,share,ttl_ms` for a global one, `|ttl_ms|id` for an
/// in-flight rule's slot or `&period@zone` for a calendar quota); rules of a line are separated by a space.
pub fn encode_rule(body: &mut String, first: bool, rule: RuleSpecRef<'_>) {
    if !first {
        body.push(' ');
    }
    if rule.shadow {
        body.push('~');
    }
    body.push_str(rule.key);
    for n in [rule.burst, rule.num, rule.den] {
        body.push(',');
        push_u64(body, n);
    }
    body.push(',');
    if let Some(settle) = rule.settle {
        if settle.delta < 0 {
            body.push('-');
        }
        push_u64(body, settle.delta.unsigned_abs());
        body.push(',');
        push_u64(body, settle.debt);
    } else {
        push_u64(body, rule.cost);
    }
    if rule.lease > 0 {
        body.push('+');
        push_u64(body, rule.lease);
    }
    if let Some(b) = rule.block {
        for n in [b.after, b.within_ms, b.for_ms] {
            body.push(',');
            push_u64(body, n);
        }
    }
    if let Some(global) = rule.global {
        encode_global(body, global);
    }
    if let Some(slot) = rule.slot {
        encode_slot(body, slot);
    }
    if let Some((period, zone)) = rule.calendar {
        encode_calendar(body, period, zone);
    }
}

/// Ends the current check's line.
pub fn end_check(body: &mut String) {
    body.push('\n');
}

/// Why a body cannot be read as a batch at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBatch(pub String);

impl fmt::Display for BadBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a batch: one entry per line, each the line or why it is refused.
pub fn parse_batch(body: &[u8]) -> Result<Vec<Result<Line, String>>, BadBatch> {
    if body.len() > MAX_BODY {
        return Err(BadBatch(format!("body over {MAX_BODY} bytes")));
    }
    let text = std::str::from_utf8(body).map_err(|_| BadBatch("body is not UTF-8".into()))?;
    let mut checks = Vec::new();
    for (n, line) in split::lines(text).enumerate() {
        if checks.len() == MAX_CHECKS {
            return Err(BadBatch(format!("more than {MAX_CHECKS} checks")));
        }
        let parsed = parse_line(line);
        checks.push(parsed.map_err(|e| format!("check {}: {e}", n + 1)));
    }
    if checks.is_empty() {
        return Err(BadBatch("no check in body".into()));
    }
    Ok(checks)
}

fn parse_line(line: &str) -> Result<Line, String> {
    if let Some(rules) = line.strip_prefix(LEASE_RETURN_MARK) {
        let rules = parse_rules(rules, None)?;
        if rules.iter().any(|r| r.lease > 0) {
            return Err("a refund takes no lease".into());
        }
        return Ok(Line {
            kind: LineKind::LeaseReturn,
            rules,
        });
    }
    if let Some(rest) = line.strip_prefix(SETTLEMENT_MARK) {
        let (id, rules) = rest.split_once(' ').unwrap_or((rest, ""));
        if !valid_settlement_id(id) {
            let shown: String = id.chars().take(MAX_SETTLEMENT_ID_LEN).collect();
            return Err(format!("bad settlement id {shown:?}"));
        }
        return Ok(Line {
            kind: LineKind::Settlement,
            rules: parse_rules(rules, Some(id))?,
        });
    }
    Ok(Line {
        kind: LineKind::Check,
        rules: parse_rules(line, None)?,
    })
}

/// The rules of a line; `settlement`: the id of the settlement they belong to.
fn parse_rules(line: &str, settlement: Option<&str>) -> Result<Vec<RuleSpec>, String> {
    let mut rules: Vec<RuleSpec> = Vec::new();
    for field in split::split(line, b' ') {
        if rules.len() == MAX_RULES {
            return Err(format!("more than {MAX_RULES} rules"));
        }
        let rule = parse_rule(field, settlement)?;
        if rules.iter().any(|r| r.key == rule.key) {
            return Err(format!("key {:?} appears twice", rule.key));
        }
        rules.push(rule);
    }
    Ok(rules)
}

fn parse_rule(field: &str, settlement: Option<&str>) -> Result<RuleSpec, String> {
    let (shadow, field) = match field.strip_prefix('~') {
        Some(rest) => (true, rest),
        None => (false, field),
    };
    let (field, calendar) = match field.split_once(CALENDAR_MARK) {
        Some((field, terms)) => (field, Some(parse_calendar(terms)?)),
        None => (field, None),
    };
    let (field, slot) = match field.split_once(SLOT_MARK) {
        Some((field, terms)) => (field, Some(parse_slot(terms)?)),
        None => (field, None),
    };
    let (field, global) = match field.split_once(GLOBAL_MARK) {
        Some((field, terms)) => (field, Some(parse_global(terms)?)),
        None => (field, None),
    };
    let mut parts = split::split(field, b',');
    let key = parts.next().unwrap_or_default();
    // `~` (shadow) and `+` (a lease return) mark a rule and a line, never a key.
    let marked = key.starts_with(['~', '+']);
    if key.is_empty()
        || key.len() > MAX_KEY_LEN
        || marked
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        let shown: String = key.chars().take(64).collect();
        return Err(format!("bad key {shown:?}"));
    }
    const FIELDS: [&str; 7] = ["burst", "num", "den", "cost", "after", "within", "for"];
    const SETTLED: [&str; 8] = [
        "burst", "num", "den", "delta", "debt", "after", "within", "for",
    ];
    // A settlement's rule has one field more (its delta and debt for the cost).
    let (fields, more): (&[&str], usize) = match settlement {
        Some(_) => (&SETTLED, 1),
        None => (&FIELDS, 0),
    };
    let mut n = [0u64; 8];
    let mut count = 0;
    let mut lease = 0;
    let mut delta = 0i64;
    for part in parts {
        let (Some(slot), Some(name)) = (n.get_mut(count), fields.get(count)) else {
            return Err(format!("rule {key:?} has extra fields"));
        };
        if more == 1 && (count == 3 || count == 4) {
            // Both may be 0; only the delta may be negative.
            let (negative, digits) = match part.strip_prefix('-') {
                Some(digits) if count == 3 => (true, digits),
                _ => (false, part),
            };
            let value = (digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse::<u64>().ok())
                .flatten()
                .filter(|v| *v < MAX_EXACT)
                .ok_or_else(|| format!("{name} of {key:?} must be an integer below 2^53"))?;
            match count {
                3 => {
                    delta = if negative {
                        -(value as i64)
                    } else {
                        value as i64
                    }
                }
                _ => *slot = value,
            }
            count += 1;
            continue;
        }
        // A calendar quota refills nothing: its num is 0.
        let least = u64::from(!(count == 1 && calendar.is_some()));
        let bounded = |text: &str| {
            text.parse::<u64>()
                .ok()
                .filter(|v| (least..MAX_EXACT).contains(v))
                .ok_or_else(|| format!("{name} of {key:?} must be an integer from 1 to 2^53"))
        };
        // Only the cost may carry a lease.
        let lease_split = if count == 3 && more == 0 {
            part.split_once('+')
        } else {
            None
        };
        let number = match lease_split {
            // `0+L` asks for a lease alone: a worker topping up its lease ahead of need.
            Some(("0", wanted)) => {
                lease = bounded(wanted)?;
                count += 1;
                continue;
            }
            Some((cost, wanted)) => {
                lease = bounded(wanted)?;
                cost
            }
            // A shadow rule of cost 0 only looks: it takes nothing (a client's quota asked).
            None if count == 3 && more == 0 && shadow && part == "0" => {
                count += 1;
                continue;
            }
            None => part,
        };
        *slot = bounded(number)?;
        count += 1;
    }
    let block = match count.saturating_sub(more) {
        _ if count < 4 + more => {
            let name = fields.get(count).copied().unwrap_or("cost");
            return Err(format!(
                "{name} of {key:?} must be an integer from 1 to 2^53"
            ));
        }
        4 => None,
        7 => Some(Block {
            after: n[4 + more],
            within_ms: n[5 + more],
            for_ms: n[6 + more],
        }),
        5 | 6 => {
            return Err(format!(
                "rule {key:?} has extra fields (a block needs after, within and for)"
            ))
        }
        _ => return Err(format!("rule {key:?} has extra fields")),
    };
    let [burst, num, den, fourth, fifth, ..] = n;
    let settle = settlement.map(|id| Settle {
        delta,
        debt: fifth,
        id: id.to_string(),
    });
    let (cost, debt) = match &settle {
        Some(settle) => (0, settle.debt),
        None => (fourth, 0),
    };
    let rule = RuleSpec {
        key: key.to_string(),
        burst,
        num,
        den,
        cost,
        lease,
        block,
        shadow,
        overridden: None,
        settle,
        global,
        slot,
        calendar,
        bounds: None,
        plan: None,
    };
    if rule.calendar.is_some() {
        // Its period's tokens come back at once at the next period: leasing them across
        // the reset would spend them twice.
        let what = [
            (
                rule.num != 0 || rule.den != 1,
                "refilling (its rate is 0,1)",
            ),
            (
                rule.global.is_some() || rule.slot.is_some(),
                "global or in flight",
            ),
            (rule.lease > 0, "leased"),
        ];
        if let Some((_, what)) = what.iter().find(|(is, _)| *is) {
            return Err(format!("a calendar quota {key:?} cannot be {what}"));
        }
    }
    if rule.slot.is_some() {
        // A slot is a request's own: one per request, held or not, never leased nor blocked.
        let what = [
            (rule.global.is_some(), "global"),
            (rule.lease > 0, "leased"),
            (rule.block.is_some(), "blocking"),
            (
                rule.settle.as_ref().is_some_and(|s| s.delta != 0),
                "settling tokens",
            ),
            (
                rule.settle.is_none() && rule.cost != 1 && !(rule.shadow && rule.cost == 0),
                "costing other than 1 (or 0 for a look)",
            ),
        ];
        if let Some((_, what)) = what.iter().find(|(is, _)| *is) {
            return Err(format!("a slot of {key:?} cannot be {what}"));
        }
    }
    // A bucket's level stays within -debt .. burst tokens.
    let span = u128::from(rule.burst) + u128::from(debt);
    if span * u128::from(rule.den) >= u128::from(MAX_EXACT) {
        return Err(format!(
            "(burst + debt) x den of {key:?} must stay below 2^53"
        ));
    }
    if delta.unsigned_abs() > span as u64 {
        return Err(format!("delta of {key:?} exceeds its burst and debt"));
    }
    if rule.cost > rule.burst {
        return Err(format!("cost of {key:?} exceeds its burst"));
    }
    if rule.lease > rule.burst {
        return Err(format!("lease of {key:?} exceeds its burst"));
    }
    Ok(rule)
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
