//! Calendar quotas in the token bucket script on a real Valkey, the periods' instants given
//! by hand around Redis's clock: a period admits its quota and nothing more (no refill),
//! a denial waits until the period ends, a new period is full again (what was spent or
//! owed before is forgotten), a check is all-or-nothing with a token bucket beside it,
//! settlements count in the period they arrive in, an override's bucket resets too, and a
//! server time outside the periods sent refuses the call.

use crate::common::buckets::{hourly, redis_now_ms, store};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::store::check::{RuleOutcome, RuleSpec};
use ratelimit_bridge::store::Store;
use ratelimit_protocol::calendar::{Bounds, Calendar, Period};
use ratelimit_protocol::{Overridden, Settle};

const HOUR: u64 = 3_600_000;

/// A calendar quota of `quota` on `key`, its periods `bounds`.
fn quota(key: &str, quota: u64, cost: u64, bounds: Bounds) -> RuleSpec {
    RuleSpec {
        calendar: Some(Calendar {
            period: Period::Day,
            zone: "UTC".into(),
        }),
        bounds: Some(bounds),
        ..RuleSpec::plain(key, quota, 0, 1, cost)
    }
}

/// Periods of an hour, the one holding `now` ending at `end`.
fn ending(now: u64, end: u64) -> Bounds {
    assert!(end > now && end - now <= HOUR);
    [end - 2 * HOUR, end - HOUR, end, end + HOUR]
}

/// Periods whose current one started after every write so far (Redis's time then, and a
/// ms), and holds Redis's time a few ms later.
async fn next_period(valkey: &Valkey) -> Bounds {
    let cut = redis_now_ms(valkey) + 1;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let later = redis_now_ms(valkey);
    assert!(later >= cut);
    [cut - HOUR, cut, later + HOUR, later + 2 * HOUR]
}

async fn check(store: &Store, rules: Vec<RuleSpec>) -> Vec<RuleOutcome> {
    store.check(&rules).await.unwrap().1
}

fn ttl_ms(valkey: &Valkey, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut valkey.connection())
        .unwrap()
}

#[tokio::test]
async fn a_period_admits_its_quota_and_waits_for_its_end() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let now = redis_now_ms(&valkey);
    let end = now + 600_000;
    let q = |cost| quota("rl:monthly:alice", 5, cost, ending(now, end));
    let first = check(&store, vec![q(2)]).await;
    assert!(first[0].allowed);
    assert_eq!(first[0].remaining, 3);
    // The reset is the period's end, however much is left.
    assert!(
        (end - now - 1_000..=end - now).contains(&first[0].full_ms),
        "{first:?}"
    );
    assert!(check(&store, vec![q(3)]).await[0].allowed);
    // Nothing comes back within the period.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let denied = check(&store, vec![q(1)]).await;
    assert!(!denied[0].allowed);
    assert_eq!(denied[0].remaining, 0);
    let wait = denied[0].wait_ms;
    assert!(
        (end - now - 1_000..=end - now).contains(&wait),
        "{denied:?}"
    );
    // The key lives a second past the period's end, when it would read full anyway.
    let ttl = ttl_ms(&valkey, "rl:monthly:alice") as u64;
    assert!(
        (wait..=wait + 1_000).contains(&ttl),
        "ttl {ttl}, wait {wait}"
    );
}

#[tokio::test]
async fn a_new_period_is_full_whatever_the_last_spent_or_owed() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:monthly:bob";
    let now = redis_now_ms(&valkey);
    assert!(check(&store, vec![quota(key, 4, 4, ending(now, now + HOUR))]).await[0].allowed);
    // A metered settlement takes the bucket into debt.
    let owe = RuleSpec {
        cost: 0,
        settle: Some(Settle {
            delta: 3,
            debt: 10,
            id: "s1".into(),
        }),
        ..quota(key, 4, 0, ending(now, now + HOUR))
    };
    let settled = store.settle_all(&[vec![owe]]).await.remove(0).unwrap().1;
    assert_eq!(settled[0].owed, 3);
    assert!(!check(&store, vec![quota(key, 4, 1, ending(now, now + HOUR))]).await[0].allowed);
    // A period that started after the last write: full again, debt forgotten.
    let next = next_period(&valkey).await;
    let fresh = check(&store, vec![quota(key, 4, 1, next)]).await;
    assert!(fresh[0].allowed, "{fresh:?}");
    assert_eq!(fresh[0].remaining, 3);
    // A settlement arriving in it counts in it.
    let late = RuleSpec {
        cost: 0,
        settle: Some(Settle {
            delta: 2,
            debt: 10,
            id: "s2".into(),
        }),
        ..quota(key, 4, 0, next)
    };
    let settled = store.settle_all(&[vec![late]]).await.remove(0).unwrap().1;
    assert_eq!(settled[0].remaining, 1);
}

#[tokio::test]
async fn a_check_fits_both_the_quota_and_the_bucket_beside_it_or_takes_from_neither() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let now = redis_now_ms(&valkey);
    let q = || quota("rl:daily:carol", 2, 1, ending(now, now + HOUR));
    let b = || hourly("rl:hourly:carol", 10);
    for _ in 0..2 {
        assert!(check(&store, vec![q(), b()])
            .await
            .iter()
            .all(|r| r.allowed));
    }
    let denied = check(&store, vec![q(), b()]).await;
    assert!(!denied[0].allowed);
    // The bucket gave nothing to the denied check.
    let bucket = check(&store, vec![b()]).await;
    assert_eq!(bucket[0].remaining, 7);
    // And a bucket that lacks the cost keeps the quota's tokens.
    let q2 = || quota("rl:daily:dave", 2, 1, ending(now, now + HOUR));
    let empty = || hourly("rl:hourly:dave", 1);
    assert!(check(&store, vec![empty()]).await[0].allowed);
    assert!(!check(&store, vec![q2(), empty()]).await[1].allowed);
    assert_eq!(check(&store, vec![q2()]).await[0].remaining, 1);
}

#[tokio::test]
async fn an_overrides_bucket_on_a_quota_resets_with_its_period() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:monthly:erin";
    let now = redis_now_ms(&valkey);
    let under = |bounds| RuleSpec {
        overridden: Some(Overridden {
            burst: 3,
            num: 0,
            den: 1,
            until_ms: now + 10 * HOUR,
        }),
        ..quota(key, 1, 1, bounds)
    };
    for _ in 0..3 {
        assert!(check(&store, vec![under(ending(now, now + HOUR))]).await[0].allowed);
    }
    let denied = check(&store, vec![under(ending(now, now + HOUR))]).await;
    assert!(!denied[0].allowed);
    assert!(
        denied[0].wait_ms <= HOUR && denied[0].wait_ms > HOUR - 1_000,
        "{denied:?}"
    );
    let next = next_period(&valkey).await;
    let fresh = check(&store, vec![under(next)]).await;
    assert!(fresh[0].allowed, "{fresh:?}");
    assert_eq!(fresh[0].remaining, 2);
}

#[tokio::test]
async fn periods_that_miss_the_servers_time_refuse_the_call() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let now = redis_now_ms(&valkey);
    for bounds in [
        [now + HOUR, now + 2 * HOUR, now + 3 * HOUR, now + 4 * HOUR],
        [now - 4 * HOUR, now - 3 * HOUR, now - 2 * HOUR, now - HOUR],
    ] {
        let out = store.check(&vec![quota("rl:q:frank", 5, 1, bounds)]).await;
        assert!(out.is_err_and(|e| e.contains("no period")), "{bounds:?}");
    }
}

#[tokio::test]
async fn a_quota_resized_within_its_period_keeps_what_was_spent_spent() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let key = "rl:monthly:gina";
    let now = redis_now_ms(&valkey);
    let bounds = ending(now, now + HOUR);
    for _ in 0..2 {
        assert!(check(&store, vec![quota(key, 2, 1, bounds)]).await[0].allowed);
    }
    assert!(!check(&store, vec![quota(key, 2, 1, bounds)]).await[0].allowed);
    // An upgrade to 6 (a client's plan): 4 more, not 6 and not none.
    let upgraded = check(&store, vec![quota(key, 6, 1, bounds)]).await;
    assert_eq!((upgraded[0].allowed, upgraded[0].remaining), (true, 3));
    // A downgrade to 4 of which 3 are spent: 1 more; to 2: none, and no debt.
    assert_eq!(
        check(&store, vec![quota(key, 4, 1, bounds)]).await[0].remaining,
        0
    );
    let down = check(&store, vec![quota(key, 2, 1, bounds)]).await;
    assert!(!down[0].allowed, "{down:?}");
    // Back to 6: 4 were spent, this is the 5th.
    let back = check(&store, vec![quota(key, 6, 1, bounds)]).await;
    assert_eq!((back[0].allowed, back[0].remaining), (true, 1));
}
