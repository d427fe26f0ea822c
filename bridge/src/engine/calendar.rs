//! Where a calendar quota's periods start: the bridge's time zone database (bundled with
//! it) turns a rule's period and zone into the instants the script picks from (`Bounds`),
//! around the bridge's clock. A period starts at midnight (or, on a day whose midnight a
//! daylight-saving change skips, at the first instant after it), so a day lasts 23 or 25
//! hours across such a change, and a month as long as it is.

use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};
use ratelimit_protocol::calendar::{Bounds, Calendar, Period};
use ratelimit_protocol::RuleSpec;
use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most calendars whose bounds are kept: what gateways send is a few per configuration, so
/// past this (a hostile caller's anchors) the cache starts over rather than grows.
const CACHED: usize = 4096;

/// The bounds last computed for each calendar, good while the bridge's clock is in their
/// second period.
fn cache() -> &'static RwLock<HashMap<Calendar, Bounds>> {
    static CACHE: OnceLock<RwLock<HashMap<Calendar, Bounds>>> = OnceLock::new();
    CACHE.get_or_init(RwLock::default)
}

/// Gives each calendar quota of `rules` its bounds now; fails (why, the check's own fault)
/// for a time zone the database lacks or a period past its range.
pub fn bound(rules: &mut [RuleSpec]) -> Result<(), String> {
    if rules.iter().all(|r| r.calendar.is_none()) {
        return Ok(());
    }
    let now = now_ms();
    for rule in rules.iter_mut() {
        if let Some(calendar) = &rule.calendar {
            rule.bounds = Some(bounds_at(calendar, now)?);
        }
    }
    Ok(())
}

/// The bounds of `calendar` around `now` (ms since the epoch), from the cache while they
/// hold it.
pub fn bounds_at(calendar: &Calendar, now: i64) -> Result<Bounds, String> {
    let holds = |b: &Bounds| {
        i64::try_from(b[1]).is_ok_and(|s| s <= now) && i64::try_from(b[2]).is_ok_and(|e| now < e)
    };
    {
        // Every check of a calendar quota reads here: shared, and written once a period.
        let cached = cache().read().unwrap_or_else(PoisonError::into_inner);
        if let Some(bounds) = cached.get(calendar).filter(|b| holds(b)) {
            return Ok(*bounds);
        }
    }
    let bounds = compute(calendar, now)?;
    let mut cache = cache().write().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(calendar.clone(), bounds);
    Ok(bounds)
}

/// Whether the bundled database has `zone`, or why not.
pub fn known_zone(zone: &str) -> Result<(), String> {
    time_zone(zone).map(drop)
}

fn time_zone(name: &str) -> Result<TimeZone, String> {
    TimeZone::get(name).map_err(|_| format!("no time zone {name:?} in the bridge's database"))
}

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// The starts of the period before the one holding `now`, of that one, and of the two
/// after it.
fn compute(calendar: &Calendar, now: i64) -> Result<Bounds, String> {
    let zone = time_zone(&calendar.zone)?;
    let fail = |e: jiff::Error| format!("calendar {:?}: {e}", calendar.zone);
    let today = zone
        .to_datetime(Timestamp::from_millisecond(now).map_err(fail)?)
        .date();
    let start = period_start(calendar.period, today).map_err(fail)?;
    let mut bounds = [0u64; 4];
    for (slot, k) in bounds.iter_mut().zip(-1..=2) {
        let date = start.checked_add(step(calendar.period, k)?).map_err(fail)?;
        let instant = zone
            .to_ambiguous_timestamp(date.to_datetime(Time::midnight()))
            .compatible()
            .map_err(fail)?;
        *slot = u64::try_from(instant.as_millisecond())
            .map_err(|_| format!("calendar {:?}: a period before 1970", calendar.zone))?;
    }
    Ok(bounds)
}

/// The first day of the period that holds `today`.
fn period_start(period: Period, today: Date) -> Result<Date, jiff::Error> {
    match period {
        Period::Day => Ok(today),
        Period::Week => {
            today.checked_sub(Span::new().try_days(today.weekday().to_monday_zero_offset())?)
        }
        Period::Month => Ok(today.first_of_month()),
        Period::Year => Ok(today.first_of_year()),
        Period::Days { every, anchor } => {
            let anchor = anchor_date(anchor)?;
            let days = anchor.duration_until(today).as_secs().div_euclid(86_400);
            let periods = days.div_euclid(i64::from(every));
            anchor.checked_add(Span::new().try_days(periods * i64::from(every))?)
        }
    }
}

fn anchor_date(anchor: ratelimit_protocol::calendar::Date) -> Result<Date, jiff::Error> {
    let small = |n: u8| i8::try_from(n).unwrap_or(i8::MAX);
    let year = i16::try_from(anchor.year).unwrap_or(i16::MAX);
    Date::new(year, small(anchor.month), small(anchor.day))
}

/// `k` periods (a period's first day being a day, a Monday, a 1st, a January 1st or the
/// anchor's rhythm, `k` of them land on the next one's).
fn step(period: Period, k: i64) -> Result<Span, String> {
    let span = match period {
        Period::Day => Span::new().try_days(k),
        Period::Week => Span::new().try_days(7 * k),
        Period::Month => Span::new().try_months(k),
        Period::Year => Span::new().try_years(k),
        Period::Days { every, .. } => Span::new().try_days(k * i64::from(every)),
    };
    span.map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "calendar_tests.rs"]
mod tests;
