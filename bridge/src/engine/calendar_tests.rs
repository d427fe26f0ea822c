use super::*;
use ratelimit_protocol::calendar::Date as Anchor;

fn calendar(period: Period, zone: &str) -> Calendar {
    Calendar {
        period,
        zone: zone.into(),
    }
}

/// Bounds as Python's zoneinfo computed them (the instants of local midnights).
#[test]
fn periods_start_at_local_midnight_across_daylight_saving_and_month_lengths() {
    let cases = [
        // Paris springs forward on 2026-03-29: that day lasts 23 hours.
        (
            Period::Day,
            "Europe/Paris",
            1_774_778_400_000,
            [
                1_774_652_400_000,
                1_774_738_800_000,
                1_774_821_600_000,
                1_774_908_000_000,
            ],
        ),
        // ...and falls back on 2026-10-25: 25 hours.
        (
            Period::Day,
            "Europe/Paris",
            1_792_926_000_000,
            [
                1_792_792_800_000,
                1_792_879_200_000,
                1_792_969_200_000,
                1_793_055_600_000,
            ],
        ),
        // February of a leap year: 29 days, its last second still in it.
        (
            Period::Month,
            "UTC",
            1_835_481_599_000,
            [
                1_830_297_600_000,
                1_832_976_000_000,
                1_835_481_600_000,
                1_838_160_000_000,
            ],
        ),
        // Weeks start on Mondays.
        (
            Period::Week,
            "America/New_York",
            1_796_821_200_000,
            [
                1_796_014_800_000,
                1_796_619_600_000,
                1_797_224_400_000,
                1_797_829_200_000,
            ],
        ),
        // Santiago's clocks skip midnight on 2026-09-06: that day starts at 01:00.
        (
            Period::Day,
            "America/Santiago",
            1_788_706_800_000,
            [
                1_788_580_800_000,
                1_788_667_200_000,
                1_788_750_000_000,
                1_788_836_400_000,
            ],
        ),
        // The last second of a year at UTC+14.
        (
            Period::Year,
            "Pacific/Kiritimati",
            1_798_711_199_000,
            [
                1_735_639_200_000,
                1_767_175_200_000,
                1_798_711_200_000,
                1_830_247_200_000,
            ],
        ),
    ];
    for (period, zone, now, want) in cases {
        assert_eq!(
            compute(&calendar(period, zone), now),
            Ok(want),
            "{period:?} {zone} {now}"
        );
    }
}

#[test]
fn periods_of_days_keep_their_anchors_rhythm_both_ways() {
    let want = [
        1_795_359_600_000,
        1_796_569_200_000,
        1_797_778_800_000,
        1_798_988_400_000,
    ];
    // 2026-12-10 in Tokyo: the fortnight from 2026-12-07, 24 fortnights after the anchor,
    // and 2 before an anchor set later.
    for anchor in [(2026, 1, 5), (2027, 1, 4)] {
        let period = Period::Days {
            every: 14,
            anchor: Anchor {
                year: anchor.0,
                month: anchor.1,
                day: anchor.2,
            },
        };
        let got = compute(&calendar(period, "Asia/Tokyo"), 1_796_860_800_000);
        assert_eq!(got, Ok(want), "{anchor:?}");
    }
}

#[test]
fn an_unknown_zone_or_anchor_is_the_checks_fault() {
    let now = 1_796_644_800_000;
    let unknown = compute(&calendar(Period::Day, "Mars/Olympus_Mons"), now);
    assert!(unknown.is_err_and(|e| e.contains("Mars/Olympus_Mons")));
    let feb30 = Period::Days {
        every: 7,
        anchor: Anchor {
            year: 2026,
            month: 2,
            day: 30,
        },
    };
    assert!(compute(&calendar(feb30, "UTC"), now).is_err());
}

#[test]
fn cached_bounds_hold_the_clock_and_are_replaced_once_they_do_not() {
    let paris = calendar(Period::Day, "Europe/Paris");
    let first = bounds_at(&paris, 1_774_778_400_000);
    assert_eq!(first.map(|b| b[1]), Ok(1_774_738_800_000));
    // A day later the cached bounds no longer hold the clock.
    let next = bounds_at(&paris, 1_774_778_400_000 + 86_400_000);
    assert_eq!(next.map(|b| b[1]), Ok(1_774_821_600_000));
    let mut rules = vec![
        RuleSpec::plain("rl:q:a", 5, 0, 1, 1),
        RuleSpec::plain("rl:b", 5, 1, 1, 1),
    ];
    rules[0].calendar = Some(paris);
    assert_eq!(bound(&mut rules), Ok(()));
    let b = rules[0].bounds.unwrap_or_default();
    let now = now_ms() as u64;
    assert!(b[1] <= now && now < b[2], "{b:?} {now}");
    assert_eq!(rules[1].bounds, None);
}
