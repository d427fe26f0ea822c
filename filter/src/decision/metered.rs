//! Metered rules after their check: what an admitted request reserved, what its response
//! measured, and the settlement that charges the one by the other.
//!
//! A metered rule's check took a reservation (`PlannedRule::cost`, from the rule's `meter`).
//! While the response passes, each metered rule reads its cost: a response header, or the
//! weighted fields of the body (`metering::UsageReader`). When the response ends, the
//! difference goes back as one settlement of all the request's metered rules: unused
//! tokens back, extra usage taken past 0, in full (a debt the refill repays).
//!
//! **A client never pays less than it consumed.** A response the meter reads in full is
//! charged exactly what it reported (a stream that said it was done, OpenAI's `data:
//! [DONE]`, is read in full whatever follows). One it cannot (compressed, cut short by
//! either side, malformed, poisoned, a key on a usage path given twice, or a success that
//! reports no usage at all, as an OpenAI stream that did not ask for it) is charged as if
//! it used the most it could: the rule's `max`, or more where what it showed proves more.
//! A client's choice of encoding, streaming options or timing cannot lower its bill. A
//! response that is not a success (no 2xx) and reports nothing keeps its reservation: the
//! upstream did no work a client could have chosen.

use crate::decision::local;
use crate::host::SharedData;
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
    /// Admitted by this gateway's own buckets (`failure_mode: "local"`), which settle it.
    local: bool,
    /// The response is a success (2xx): it may have consumed what its client asked for.
    succeeded: bool,
    /// The response's body reached its end (neither side cut it short).
    ended: bool,
}

/// What a response measured, and the line that settles it.
#[derive(Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The settlement's line (`= ID rules`), `None` when no rule's charge differs from its
    /// reservation, or when the local buckets were settled instead.
    pub line: Option<String>,
    /// Its number of rules.
    pub rules: usize,
    /// Tokens measured exactly, over the metered rules whose response was read in full.
    pub measured: u64,
    /// Metered rules whose response could not be read in full, charged the fallback.
    pub unmeasured: u64,
    /// Local buckets settled (`failure_mode: "local"`), and the tokens they lent.
    pub settled_locally: u64,
    pub borrowed_locally: u64,
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
        let metering = Metering {
            rules,
            local: false,
            succeeded: false,
            ended: false,
        };
        (!metering.rules.is_empty()).then_some(metering)
    }

    /// As `reserved`, for a check this gateway's own buckets admitted
    /// (`failure_mode: "local"`): its settlement goes to them, not to the backend.
    pub fn reserved_locally(
        config: &Config,
        planned: &[PlannedRule],
        results: &[RuleResult],
    ) -> Option<Metering> {
        let mut metering = Metering::reserved(config, planned, results)?;
        metering.local = true;
        Some(metering)
    }

    /// The response's headers: `header` reads one by name (`:status` too). Each rule takes
    /// its cost from its meter's header if the response has it, else prepares to read the
    /// body (of `content_type`, in the identity coding only). Whether the body must be
    /// read.
    pub fn response_headers(
        &mut self,
        config: &Config,
        header: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> bool {
        self.succeeded = header(":status").is_some_and(|s| s.len() == 3 && s.starts_with(b"2"));
        let plain = header("content-encoding").is_none_or(|e| is_identity(&e));
        let format = header("content-type")
            .and_then(|t| body_format(&t))
            .filter(|_| plain);
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
                r.reader = format.map(|format| UsageReader::new(format, meter.paths()));
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

    /// The response's body reached its end: what was read of it is all there was.
    pub fn ended(&mut self) {
        self.ended = true;
    }

    /// Ends the response (whole, or cut short if `ended` was not called): the settlement
    /// of what it measured, as settlement `id` (`valid_settlement_id`); a local one is
    /// applied to `store`'s buckets at `now_ms` at once.
    pub fn settle(
        mut self,
        config: &Config,
        id: &str,
        store: &impl SharedData,
        now_ms: u64,
    ) -> Settlement {
        let mut out = Settlement {
            line: None,
            rules: 0,
            measured: 0,
            unmeasured: 0,
            settled_locally: 0,
            borrowed_locally: 0,
        };
        let mut line = String::new();
        let (succeeded, ended) = (self.succeeded, self.ended);
        for r in &mut self.rules {
            let Some(meter) = meter_of(config, r.rule) else {
                continue;
            };
            let charge = match measure(meter, r, ended) {
                Measure::Exact(cost) => {
                    out.measured = out.measured.saturating_add(cost);
                    cost
                }
                Measure::Unread { shown } => {
                    out.unmeasured += 1;
                    // The most it could have used: the rule's max (never less than what
                    // the client's own reservation said), or what it showed.
                    let floor = if succeeded {
                        meter.max_reserve
                    } else {
                        r.reserved
                    };
                    floor.max(r.reserved).max(shown)
                }
            };
            // At most the burst and the debt more: the bridge's bound, and all it can take.
            let most = r.limit.burst.saturating_add(meter.debt);
            let delta =
                i128::from(charge.min(r.reserved.saturating_add(most))) - i128::from(r.reserved);
            let Ok(delta) = i64::try_from(delta) else {
                continue;
            };
            if delta == 0 {
                continue;
            }
            if self.local {
                let name = config.rule_name(r.rule);
                let bucket = local::Bucket {
                    rule_name: name,
                    key: &r.key,
                    limit: &r.limit,
                    cost: r.reserved,
                };
                let lent = local::settle(store, &bucket, delta, meter.debt, config.local, now_ms);
                out.settled_locally += 1;
                out.borrowed_locally = out.borrowed_locally.saturating_add(lent);
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
                global: None,
                slot: None,
                calendar: config.rules.get(r.rule).and_then(|c| c.calendar(&r.limit)),
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

/// Whether a request of `planned` rules must ask its upstream for a response in the
/// identity coding (`Accept-Encoding: identity`): a metered rule reads the response's
/// body, which the meter reads only uncompressed. A client's own `Accept-Encoding` still
/// reaches a compressor that runs before this filter (Envoy's, on the way back).
pub fn reads_body(config: &Config, mut rules: impl Iterator<Item = usize>) -> bool {
    rules.any(|rule| meter_of(config, rule).is_some_and(|m| !m.body.is_empty()))
}

fn meter_of(config: &Config, rule: usize) -> Option<&MeterPolicy> {
    config.rules.get(rule)?.meter.as_ref()
}

/// What a response measured for one rule.
#[derive(Debug, PartialEq, Eq)]
enum Measure {
    /// Read in full: what it cost.
    Exact(u64),
    /// Not read in full (or nothing reported): `shown` is what the counts it did show
    /// prove at least (its positive fields at their largest).
    Unread { shown: u64 },
}

/// What rule `r`'s response measured: its header's cost, else its body's fields' if the
/// body was read to its end, trusted, and reported some.
fn measure(meter: &MeterPolicy, r: &mut Reserved, ended: bool) -> Measure {
    if let Some(cost) = r.from_header {
        return Measure::Exact(cost);
    }
    let Some(reader) = r.reader.as_mut() else {
        return Measure::Unread { shown: 0 };
    };
    reader.finish();
    // OpenAI's SDKs close a stream on its `[DONE]`, which may reach the gateway before the
    // stream's own end: what the stream reported is then all of it.
    let ended = ended || reader.done();
    let exact = (ended && reader.trusted())
        .then(|| meter.cost_of(reader.values()))
        .flatten();
    match exact {
        Some(cost) => Measure::Exact(cost),
        None => Measure::Unread {
            shown: meter.at_least(reader.largest()),
        },
    }
}

/// Whether a `Content-Encoding` leaves the body as it is: `identity`, or nothing.
pub(crate) fn is_identity(encoding: &[u8]) -> bool {
    encoding.split(|&b| b == b',').all(|coding| {
        coding.trim_ascii().is_empty() || coding.trim_ascii().eq_ignore_ascii_case(b"identity")
    })
}

/// How a body of `content_type` carries its JSON, if it does.
fn body_format(content_type: &[u8]) -> Option<BodyFormat> {
    let essence = content_type.split(|&b| b == b';').next()?.trim_ascii();
    if essence.eq_ignore_ascii_case(b"text/event-stream") {
        Some(BodyFormat::EventStream)
    } else if essence.eq_ignore_ascii_case(b"application/vnd.amazon.eventstream") {
        Some(BodyFormat::AwsEventStream)
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

#[cfg(test)]
#[path = "metered_props_tests.rs"]
mod props;

#[cfg(test)]
#[path = "metered_formats_tests.rs"]
mod formats;
