//! A rule's quota: `requests` per `per`, with a bucket of `burst` tokens; or, when `per` is
//! a calendar period (`day`, `week`, `month`, `year`, or `14d` with an `anchor` date), a
//! *calendar quota*: `requests` for each period, all of them again at the next one.
//!
//! The token bucket works in integer units so that every gateway and Redis compute the same
//! result without float drift: one token is `den` units and the bucket refills `num` units per
//! millisecond, where `num / den` is `requests / per_ms` reduced. Config validation keeps
//! every quantity the Lua script handles below 2^53, the exact-integer range of its doubles.

use crate::error::ConfigError;
use ratelimit_protocol::calendar::{parse_date, parse_period, Period, MAX_PERIOD_DAYS};
use ratelimit_protocol::gcd;
pub use ratelimit_protocol::MAX_EXACT;
use serde::Deserialize;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    requests: u64,
    per: String,
    burst: Option<u64>,
    /// The date one period of a calendar quota of `Nd` starts.
    anchor: Option<String>,
}

/// A validated quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Refill: `requests` tokens every `per_ms` milliseconds.
    pub requests: u64,
    pub per_ms: u64,
    /// Bucket capacity in tokens.
    pub burst: u64,
    /// Refill rate as a reduced fraction: `num` units per ms, one token being `den` units.
    pub num: u64,
    pub den: u64,
    /// A calendar quota's period (then `num` is 0, `den` 1, `burst` is `requests` and
    /// `per_ms` the period's usual length): its rule's `time_zone` says where it starts.
    pub calendar: Option<Period>,
}

/// The usual length of a calendar period, for what wants one number (its rule's `per` in a
/// sentence, the window an API answers).
fn usual_ms(period: Period) -> u64 {
    const DAY: u64 = 86_400_000;
    match period {
        Period::Day => DAY,
        Period::Week => 7 * DAY,
        Period::Month => 30 * DAY,
        Period::Year => 365 * DAY,
        Period::Days { every, .. } => u64::from(every) * DAY,
    }
}

/// Parses `500ms`, `10s`, `1m`, `2h`, `1d` into milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale).filter(|&ms| ms > 0)
}

/// An optional duration of the configuration (`field`, `text` as written): `default` when
/// it is absent, else its milliseconds if they are within `range` (`words`: the range as
/// the error says it, e.g. "from 1s to 1h").
pub(crate) fn duration_within(
    field: &str,
    text: Option<&str>,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
    words: &str,
) -> Result<u64, ConfigError> {
    let Some(text) = text else {
        return Ok(default);
    };
    match parse_duration_ms(text) {
        Some(ms) if range.contains(&ms) => Ok(ms),
        _ => Err(ConfigError {
            field: field.to_string(),
            problem: format!("{text:?} is not a duration {words}"),
        }),
    }
}

impl RawLimit {
    pub(crate) fn validate(self, field: &str, cost: u64) -> Result<Limit, ConfigError> {
        let fail = |name: &str, problem: String| {
            Err(ConfigError {
                field: format!("{field}.{name}"),
                problem,
            })
        };
        if let Some(period) = self.calendar(field)? {
            if self.burst.is_some() {
                return fail(
                    "burst",
                    "a calendar quota's bucket holds its requests, refilled at each period's \
                     start: it takes no burst"
                        .into(),
                );
            }
            return Limit::calendar(self.requests, period, cost)
                .or_else(|(name, problem)| fail(name, problem));
        }
        let Some(per_ms) = parse_duration_ms(&self.per) else {
            return fail(
                "per",
                format!(
                    "{:?} is not a duration like 500ms, 10s, 1m, 1h or 1d, nor a calendar \
                     period (day, week, month, year)",
                    self.per
                ),
            );
        };
        Limit::new(self.requests, per_ms, self.burst, cost)
            .or_else(|(name, problem)| fail(name, problem))
    }
}

impl RawLimit {
    /// The calendar period this limit names, if it is a calendar quota: `per` a period's
    /// name, or `Nd` with an `anchor`.
    fn calendar(&self, field: &str) -> Result<Option<Period>, ConfigError> {
        let Some(anchor) = &self.anchor else {
            return Ok(parse_period(&self.per).filter(|p| !matches!(p, Period::Days { .. })));
        };
        let fail = |name: &str, problem: String| ConfigError {
            field: format!("{field}.{name}"),
            problem,
        };
        let days = (self.per.strip_suffix('d'))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u16>().ok())
            .filter(|n| (1..=MAX_PERIOD_DAYS).contains(n))
            .ok_or_else(|| {
                fail(
                    "per",
                    format!(
                        "{:?}: a quota with an anchor lasts whole days, 1d to {MAX_PERIOD_DAYS}d",
                        self.per
                    ),
                )
            })?;
        let anchor = parse_date(anchor).ok_or_else(|| {
            fail(
                "anchor",
                format!("{anchor:?} is not a date like 2026-01-05"),
            )
        })?;
        Ok(Some(Period::Days {
            every: days,
            anchor,
        }))
    }
}

impl Limit {
    /// A calendar quota of `requests` per `period` for checks of `cost`.
    pub fn calendar(
        requests: u64,
        period: Period,
        cost: u64,
    ) -> Result<Limit, (&'static str, String)> {
        if requests == 0 {
            return Err(("requests", "must be at least 1".into()));
        }
        if requests >= MAX_EXACT {
            return Err(("requests", "must stay below 2^53".into()));
        }
        if cost > requests {
            return Err((
                "requests",
                format!("must hold at least one request's cost ({cost})"),
            ));
        }
        Ok(Limit {
            requests,
            per_ms: usual_ms(period),
            burst: requests,
            num: 0,
            den: 1,
            calendar: Some(period),
        })
    }

    /// `requests` every `per_ms` with a bucket of `burst` tokens (default: `requests`) for
    /// checks of `cost`, the rate reduced and every quantity within the script's exact
    /// range; or the field at fault (`requests`, `per`, `burst`) and why. The plugin's
    /// limits and the bridge's overrides are both made here.
    pub fn new(
        requests: u64,
        per_ms: u64,
        burst: Option<u64>,
        cost: u64,
    ) -> Result<Limit, (&'static str, String)> {
        if requests == 0 {
            return Err(("requests", "must be at least 1".into()));
        }
        if per_ms == 0 {
            return Err(("per", "must be at least 1 ms".into()));
        }
        let burst = burst.unwrap_or(requests);
        if burst == 0 {
            return Err(("burst", "must be at least 1".into()));
        }
        if cost > burst {
            return Err((
                "burst",
                format!("the bucket ({burst}) must hold at least one request's cost ({cost})"),
            ));
        }
        let g = gcd(requests, per_ms);
        let (num, den) = (requests / g, per_ms / g);
        // The script multiplies tokens by `den`; keep the full bucket exact.
        if u128::from(burst) * u128::from(den) >= u128::from(MAX_EXACT) || num >= MAX_EXACT {
            return Err((
                "burst",
                "too large for this period: burst x period must stay below 2^53 ms".into(),
            ));
        }
        Ok(Limit {
            requests,
            per_ms,
            burst,
            num,
            den,
            calendar: None,
        })
    }
    /// The period in words, for the 429 body: "minute", "30 seconds", "250 ms".
    pub fn period_phrase(&self) -> String {
        match self.calendar {
            Some(Period::Days { every, .. }) => return format!("{every} days"),
            Some(period) => {
                let mut name = String::new();
                ratelimit_protocol::calendar::push_period(&mut name, period);
                return name;
            }
            None => {}
        }
        let ms = self.per_ms;
        for (unit, size) in [
            ("day", 86_400_000),
            ("hour", 3_600_000),
            ("minute", 60_000),
            ("second", 1_000),
        ] {
            if ms == size {
                return unit.into();
            }
            if ms % size == 0 {
                return format!("{} {unit}s", ms / size);
            }
        }
        format!("{ms} ms")
    }

    /// The window in whole seconds (at least 1), for the IETF `w=` parameter.
    pub fn window_s(&self) -> u64 {
        self.per_ms.div_ceil(1000).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit `RawLimit::validate` makes of these fields, or why it refuses them.
    fn validated(
        requests: u64,
        per: &str,
        burst: Option<u64>,
        cost: u64,
    ) -> Result<Limit, ConfigError> {
        RawLimit {
            requests,
            per: per.into(),
            burst,
            anchor: None,
        }
        .validate("l", cost)
    }

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("10s"), Some(10_000));
        assert_eq!(parse_duration_ms("1m"), Some(60_000));
        assert_eq!(parse_duration_ms("2h"), Some(7_200_000));
        assert_eq!(parse_duration_ms("1d"), Some(86_400_000));
    }

    #[test]
    fn bad_durations_are_refused() {
        for bad in [
            "",
            "m",
            "10",
            "1w",
            "-1s",
            "0s",
            "1.5s",
            " 1s",
            "99999999999999999999d",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rate_is_reduced_and_burst_defaults_to_requests() {
        let l = validated(100, "1m", None, 1).unwrap();
        assert_eq!((l.burst, l.num, l.den), (100, 1, 600));
        let l = validated(50_000, "1s", Some(60_000), 1).unwrap();
        assert_eq!((l.burst, l.num, l.den), (60_000, 50, 1));
    }

    #[test]
    fn cost_above_burst_is_refused_naming_burst() {
        let e = validated(3, "1s", None, 5).unwrap_err();
        assert_eq!(e.field, "l.burst");
    }

    #[test]
    fn quantities_beyond_exact_lua_integers_are_refused() {
        let e = validated(1, "1000000d", Some(1_000_000_000), 1).unwrap_err();
        assert_eq!(e.field, "l.burst");
        assert!(validated(1, "1d", Some(100_000_000), 1).is_ok());
    }

    #[test]
    fn period_phrases_read_naturally() {
        let phrase = |per: &str| validated(1, per, None, 1).unwrap().period_phrase();
        assert_eq!(phrase("1m"), "minute");
        assert_eq!(phrase("1h"), "hour");
        assert_eq!(phrase("30s"), "30 seconds");
        assert_eq!(phrase("2d"), "2 days");
        assert_eq!(phrase("1500ms"), "1500 ms");
    }
}
