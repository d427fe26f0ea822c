//! Metered rules after their check: what an admitted request reserved, what its response
//! measured, and the settlement line that corrects the one by the other.
//!
//! A metered rule's check took a reservation (`PlannedRule::cost`, from the rule's `meter`).
//! While the response passes, each metered rule reads its cost: a response header, or the
//! weighted fields of the body (`metering::UsageReader`). When the response ends, the
//! difference goes back to Redis as one settlement of all the request's metered rules:
//! unused tokens back, extra usage taken past 0 down to the meter's debt bound. A rule
//! that measured nothing usable (no usage in the body, a poisoned field, a response cut
//! before its usage) keeps its reservation: a client never pays less than it reserved
//! for a response that said nothing, and never more than its burst and debt.

use crate::metering::{BodyFormat, UsageReader};
use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;
use ratelimit_config::config::Config;
use ratelimit_config::limit::Limit;
use ratelimit_config::meter::MeterPolicy;
use ratelimit_protocol::{encode_rule, end_check, start_settlement, Block, RuleSpecRef, Settle};

/// One metered rule's reservation, kept until the response ends.
#[derive(Debug)]
struct Reserved {
    /// Index of the rule in `Config::rules`.
    rule: usize,
    key: String,
    limit: Limit,
    block: Option<Block>,
    shadow: bool,
    /// Tokens the check took (0: a shadow rule that lacked them took nothing).
    reserved: u64,
    /// The cost the response's header gave, once seen.
    from_header: Option<u64>,
    /// The body's reader, when the rule reads the body and the body is JSON.
    reader: Option<UsageReader>,
}

/// An admitted request's metered rules, from its check to its settlement.
#[derive(Debug)]
pub struct Metering {
    rules: Vec<Reserved>,
}

/// What a response measured, and the line that settles it.
#[derive(Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The settlement's line (`= ID rules`), `None` when no rule's measure differs from
    /// its reservation.
    pub line: Option<String>,
    /// Its number of rules.
    pub rules: usize,
    /// Tokens measured, over the metered rules that measured something.
    pub measured: u64,
}

impl Metering {
    /// The metered rules among `planned` of an admitted check, with what each took
    /// according to `results` (the reply's, in the same order); `None` if none is metered.
    pub fn reserved(
        config: &Config,
        planned: &[PlannedRule],
        results: &[RuleResult],
    ) -> Option<Metering> {
        let rules: Vec<Reserved> = planned
            .iter()
            .zip(results)
            .filter(|(p, _)| config.rules.get(p.rule).is_some_and(|r| r.meter.is_some()))
            .map(|(p, result)| Reserved {
                rule: p.rule,
                key: p.key.clone(),
                limit: p.limit,
                block: p.block,
                shadow: p.shadow,
                // A shadow rule that lacked the cost let its check pass taking nothing.
                reserved: if result.wait_ms == 0 { p.cost } else { 0 },
                from_header: None,
                reader: None,
            })
            .collect();
        (!rules.is_empty()).then_some(Metering { rules })
    }

    /// The response's headers: `header` reads one by name. Each rule takes its cost from
    /// its meter's header if the response has it, else prepares to read the body (of
    /// `content_type`). Whether the body must be read.
    pub fn response_headers(
        &mut self,
        config: &Config,
        header: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> bool {
        let format = header("content-type").and_then(|t| body_format(&t));
        for r in &mut self.rules {
            let Some(meter) = meter_of(config, r.rule) else {
                continue;
            };
            r.from_header = meter
                .header
                .as_deref()
                .and_then(&header)
                .and_then(|v| count(&v));
            if r.from_header.is_none() && !meter.body.is_empty() {
                r.reader = format.map(|format| {
                    let paths = meter.body.iter().map(|f| f.path.clone()).collect();
                    UsageReader::new(format, paths)
                });
            }
        }
        self.rules.iter().any(|r| r.reader.is_some())
    }

    /// A chunk of the response body as it passes.
    pub fn body(&mut self, chunk: &[u8]) {
        for reader in self.rules.iter_mut().filter_map(|r| r.reader.as_mut()) {
            reader.feed(chunk);
        }
    }

    /// Ends the response (whole or cut short): the settlement of what it measured, as
    /// settlement `id` (`valid_settlement_id`).
    pub fn settle(mut self, config: &Config, id: &str) -> Settlement {
        let mut out = Settlement {
            line: None,
            rules: 0,
            measured: 0,
        };
        let mut line = String::new();
        for r in &mut self.rules {
            let Some(meter) = meter_of(config, r.rule) else {
                continue;
            };
            let Some(measured) = measure(meter, r) else {
                continue;
            };
            out.measured = out.measured.saturating_add(measured);
            // At most the burst and the debt more: the bridge's bound, and all it can take.
            let most = r.limit.burst.saturating_add(meter.debt);
            let delta =
                i128::from(measured.min(r.reserved.saturating_add(most))) - i128::from(r.reserved);
            let Ok(delta) = i64::try_from(delta) else {
                continue;
            };
            if delta == 0 {
                continue;
            }
            if line.is_empty() {
                start_settlement(&mut line, id);
            }
            let settle = Settle {
                delta,
                debt: meter.debt,
                id: String::new(),
            };
            let rule = RuleSpecRef {
                key: &r.key,
                burst: r.limit.burst,
                num: r.limit.num,
                den: r.limit.den,
                cost: 0,
                lease: 0,
                block: r.block,
                shadow: r.shadow,
                settle: Some(&settle),
            };
            encode_rule(&mut line, out.rules == 0, rule);
            out.rules += 1;
        }
        if out.rules > 0 {
            end_check(&mut line);
            out.line = Some(line);
        }
        out
    }
}

fn meter_of(config: &Config, rule: usize) -> Option<&MeterPolicy> {
    config.rules.get(rule)?.meter.as_ref()
}

/// What rule `r`'s response measured: its header's cost, else its body's fields' (none
/// seen, one poisoned, or a JSON body cut short or malformed: nothing).
fn measure(meter: &MeterPolicy, r: &mut Reserved) -> Option<u64> {
    if let Some(cost) = r.from_header {
        return Some(cost);
    }
    let reader = r.reader.as_mut()?;
    reader.finish();
    if reader.poisoned() || !reader.whole() {
        return None;
    }
    meter.cost_of(reader.values())
}

/// How a body of `content_type` carries its JSON, if it does.
fn body_format(content_type: &[u8]) -> Option<BodyFormat> {
    let essence = content_type.split(|&b| b == b';').next()?.trim_ascii();
    if essence.eq_ignore_ascii_case(b"text/event-stream") {
        Some(BodyFormat::EventStream)
    } else if essence.eq_ignore_ascii_case(b"application/json")
        || (essence.get(essence.len().saturating_sub(5)..))
            .is_some_and(|end| end.eq_ignore_ascii_case(b"+json"))
    {
        Some(BodyFormat::Json)
    } else {
        None
    }
}

/// A header's count of tokens: decimal digits only, below 2^53.
fn count(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 16 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (n < crate::metering::MAX_COUNT).then_some(n)
}

#[cfg(test)]
#[path = "metered_tests.rs"]
mod tests;
