//! A calendar quota's period, as the configuration names it, the filter writes it on a rule
//! and the bridge reads it: the rule's bucket holds `burst` tokens for each period (a day,
//! a week, a month, a year, or every `n` days from an anchor date) of a named IANA time
//! zone, refills nothing in between, and is full again at the next period's start.
//! Written `&period@zone` after the rule's other fields (`&month@Europe/Paris`,
//! `&14d/2026-01-05@Asia/Tokyo`), its rate `0,1`.
//!
//! Where a period starts is the bridge's to say (it has the time zone database): it sends
//! the script the instants of four consecutive period starts around its own clock
//! (`Bounds`), and the script picks the period that holds Redis's time, so that every
//! bridge and gateway counts a request in the same period whatever their clocks.

use crate::number::push_u64;

/// What starts a calendar quota's terms (a byte no key holds).
pub const CALENDAR_MARK: char = '&';
/// Longest time zone name (the IANA database's longest is 32 bytes).
pub const MAX_ZONE_LEN: usize = 64;
/// Most days of a period of `n` days: ten years.
pub const MAX_PERIOD_DAYS: u16 = 3660;

/// A calendar date, as an anchor is written (`2026-01-05`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Date {
    pub year: u16,
    pub month: u8,
    pub day: u8,
}

/// The length of a calendar quota's period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From Monday's midnight (ISO 8601 weeks).
    Week,
    /// From the 1st's midnight.
    Month,
    /// From January 1st's midnight.
    Year,
    /// `every` days, one period starting at `anchor`'s midnight.
    Days { every: u16, anchor: Date },
}

/// A calendar quota's terms: its period in a time zone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub period: Period,
    /// An IANA time zone name (`Europe/Paris`, `UTC`): `zone_name`'s grammar.
    pub zone: String,
}

/// The period's instants the script picks from, in ms since the epoch: the starts of four
/// consecutive periods, the bridge's clock in the second of them.
pub type Bounds = [u64; 4];

/// Whether `zone` is a time zone name as the database spells them: letters, digits and
/// `/_+-`, starting with a letter.
pub fn zone_name(zone: &str) -> bool {
    (1..=MAX_ZONE_LEN).contains(&zone.len())
        && zone.starts_with(|c: char| c.is_ascii_alphabetic())
        && zone
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
        && !zone.contains("//")
}

/// Appends a calendar quota's terms to its rule's field (`&period@zone`).
pub fn encode_calendar(body: &mut String, period: Period, zone: &str) {
    body.push(CALENDAR_MARK);
    push_period(body, period);
    body.push('@');
    body.push_str(zone);
}

/// A period as the configuration and the wire write it: `day`, `week`, `month`, `year`,
/// or `14d/2026-01-05`.
pub fn push_period(body: &mut String, period: Period) {
    match period {
        Period::Day => body.push_str("day"),
        Period::Week => body.push_str("week"),
        Period::Month => body.push_str("month"),
        Period::Year => body.push_str("year"),
        Period::Days { every, anchor } => {
            push_u64(body, u64::from(every));
            body.push_str("d/");
            push_date(body, anchor);
        }
    }
}

/// `2026-01-05`.
pub fn push_date(body: &mut String, date: Date) {
    for (n, width, sep) in [
        (u64::from(date.year), 4, "-"),
        (u64::from(date.month), 2, "-"),
        (u64::from(date.day), 2, ""),
    ] {
        let mut digits = String::new();
        push_u64(&mut digits, n);
        for _ in digits.len()..width {
            body.push('0');
        }
        body.push_str(&digits);
        body.push_str(sep);
    }
}

/// Days of `month` (1 to 12) of `year`, by the Gregorian calendar.
fn days_in(year: u16, month: u8) -> u8 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Reads a date written `YYYY-MM-DD` (years 1970 to 9999, a day of its month), strictly.
pub fn parse_date(text: &str) -> Option<Date> {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        let part = text.get(r)?;
        (part.bytes().all(|c| c.is_ascii_digit()))
            .then(|| part.parse::<u16>().ok())
            .flatten()
    };
    if b.len() != 10 || b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let date = Date {
        year,
        month: u8::try_from(month).ok()?,
        day: u8::try_from(day).ok()?,
    };
    let month = (1..=12).contains(&date.month);
    ((1970..=9999).contains(&year) && month && (1..=days_in(year, date.month)).contains(&date.day))
        .then_some(date)
}

/// Reads a period as `push_period` writes it.
pub fn parse_period(text: &str) -> Option<Period> {
    Some(match text {
        "day" => Period::Day,
        "week" => Period::Week,
        "month" => Period::Month,
        "year" => Period::Year,
        _ => {
            let (every, anchor) = text.split_once("d/")?;
            let every = (every.bytes().all(|b| b.is_ascii_digit()) && every.len() <= 4)
                .then(|| every.parse::<u16>().ok())
                .flatten()
                .filter(|n| (1..=MAX_PERIOD_DAYS).contains(n))?;
            Period::Days {
                every,
                anchor: parse_date(anchor)?,
            }
        }
    })
}

/// Reads the terms after a rule's `&`, strictly.
pub fn parse_calendar(text: &str) -> Result<Calendar, String> {
    let shown = || text.chars().take(80).collect::<String>();
    let (period, zone) = text.split_once('@').ok_or_else(|| {
        format!(
            "a calendar quota's terms are &period@zone, not {:?}",
            shown()
        )
    })?;
    let period = parse_period(period).ok_or_else(|| format!("bad period in {:?}", shown()))?;
    if !zone_name(zone) {
        return Err(format!("bad time zone in {:?}", shown()));
    }
    Ok(Calendar {
        period,
        zone: zone.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_read_back_as_written() {
        let anchor = Date {
            year: 2026,
            month: 1,
            day: 5,
        };
        for (period, zone, text) in [
            (Period::Month, "Europe/Paris", "&month@Europe/Paris"),
            (Period::Day, "UTC", "&day@UTC"),
            (Period::Week, "Etc/GMT+5", "&week@Etc/GMT+5"),
            (
                Period::Year,
                "America/Argentina/ComodRivadavia",
                "&year@America/Argentina/ComodRivadavia",
            ),
            (
                Period::Days { every: 14, anchor },
                "Asia/Tokyo",
                "&14d/2026-01-05@Asia/Tokyo",
            ),
        ] {
            let mut body = String::new();
            encode_calendar(&mut body, period, zone);
            assert_eq!(body, text);
            let parsed = parse_calendar(&body[1..]);
            assert_eq!(
                parsed,
                Ok(Calendar {
                    period,
                    zone: zone.into()
                })
            );
        }
    }

    #[test]
    fn other_spellings_are_refused() {
        for text in [
            "month",
            "month@",
            "Month@UTC",
            "0d/2026-01-05@UTC",
            "3661d/2026-01-05@UTC",
            "14d/2026-1-05@UTC",
            "14d/1969-12-31@UTC",
            "7d/2026-02-29@UTC",
            "7d/2100-02-29@UTC",
            "14d/2026-13-01@UTC",
            "14d/2026-01-00@UTC",
            "+14d/2026-01-05@UTC",
            "14d2026-01-05@UTC",
            "day@../etc/passwd",
            "day@/UTC",
            "day@Europe//Paris",
            "day@Europe/Paris@UTC",
            "day@Europe Paris",
            "day@UTC|5",
        ] {
            assert!(parse_calendar(text).is_err(), "{text}");
        }
        assert!(!zone_name(&"A".repeat(MAX_ZONE_LEN + 1)));
        assert!(zone_name(&"A".repeat(MAX_ZONE_LEN)));
        for leap in ["2028-02-29", "2000-02-29", "2026-12-31", "2026-04-30"] {
            assert!(parse_date(leap).is_some(), "{leap}");
        }
    }
}
