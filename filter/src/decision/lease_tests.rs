use super::*;
use crate::fakes::limit;

/// A lease policy of `tokens` tokens held for a second.
fn policy(tokens: u64) -> LeasePolicy {
    LeasePolicy {
        tokens,
        ttl_ms: 1_000,
    }
}

/// A lease that never runs low (no `take` asks for a top-up).
const NEVER_LOW: LeasePolicy = LeasePolicy {
    tokens: 0,
    ttl_ms: 1_000,
};

fn grant(leased: u64, remaining: u64) -> RuleResult {
    RuleResult {
        allowed: true,
        remaining,
        full_ms: 500,
        leased,
        ..RuleResult::default()
    }
}

/// Key `key` seen twice at `now_ms`, granted a lease of `leased` tokens (a limit of 100 a
/// second), and taken from once under a policy of 10: the top-up it asks for (id, lacking).
fn low_lease(leases: &mut Leases, key: &str, leased: u64, now_ms: u64) -> (u32, u64) {
    let l = limit(100, 100, 1_000);
    leases.wants(key, &l, 1_000, now_ms);
    leases.wants(key, &l, 1_000, now_ms);
    leases.granted(key, &l, &grant(leased, 50), 1_000 + now_ms);
    let taken = leases.take(key, &l, 0, policy(10), now_ms);
    taken.and_then(|t| t.top_up).expect("fewer than 10: low")
}

#[test]
fn a_bucket_seen_twice_within_the_ttl_asks_once_and_admits_from_the_grant() {
    let (mut leases, l) = (Leases::default(), limit(100, 100, 1_000));
    assert!(
        !leases.wants("k", &l, 1_000, 0),
        "first sight: a plain check"
    );
    assert!(leases.wants("k", &l, 1_000, 10), "seen again: ask");
    assert!(!leases.wants("k", &l, 1_000, 11), "one ask at a time");
    assert!(
        leases.take("k", &l, 1, NEVER_LOW, 12).is_none(),
        "nothing held yet"
    );
    leases.granted("k", &l, &grant(3, 50), 1_010);
    let shown: Vec<u64> = (0..3)
        .map(|_| {
            leases
                .take("k", &l, 1, NEVER_LOW, 20)
                .unwrap()
                .shown
                .remaining
        })
        .collect();
    assert_eq!(shown, [49, 48, 47]);
    assert!(leases.take("k", &l, 1, NEVER_LOW, 20).is_none(), "used up");
    assert!(leases.wants("k", &l, 1_000, 21), "ask again");
}

#[test]
fn a_lease_serves_only_its_limit_and_its_ttl_and_what_is_left_goes_back() {
    let (mut leases, l) = (Leases::default(), limit(100, 100, 1_000));
    leases.wants("k", &l, 1_000, 0);
    leases.wants("k", &l, 1_000, 0);
    leases.granted("k", &l, &grant(10, 50), 1_000);
    assert!(
        leases
            .take("k", &limit(5, 5, 1_000), 1, NEVER_LOW, 10)
            .is_none(),
        "another tier's limit"
    );
    assert!(
        leases.take("k", &l, 11, NEVER_LOW, 10).is_none(),
        "more than held"
    );
    assert!(leases.take("k", &l, 4, NEVER_LOW, 10).is_some());
    leases.return_taken("k", &l, 1);
    leases.expire(999);
    assert!(leases.take_returns().is_empty());
    assert!(
        leases.take("k", &l, 1, NEVER_LOW, 1_000).is_none(),
        "over at its expiry"
    );
    leases.expire(1_000);
    let back = leases.take_returns();
    assert_eq!(back.len(), 1);
    assert_eq!((back[0].key.as_str(), back[0].tokens), ("k", 7));
    assert!(leases.is_empty());
}

#[test]
fn tokens_with_nowhere_to_go_are_returned_not_lost() {
    let (mut leases, l) = (Leases::default(), limit(10, 10, 1_000));
    // A grant for a bucket no longer tracked, a put-back after expiry, a merge past burst.
    leases.granted("gone", &l, &grant(4, 0), 1_000);
    leases.return_taken("gone", &l, 1);
    leases.wants("k", &l, 1_000, 0);
    leases.wants("k", &l, 1_000, 0);
    leases.granted("k", &l, &grant(8, 0), 1_000);
    leases.wants("k", &l, 1_000, 1);
    leases.granted("k", &l, &grant(6, 0), 1_001);
    let back: Vec<u64> = leases.take_returns().iter().map(|r| r.tokens).collect();
    assert_eq!(back, [4, 1, 4], "14 held would pass the burst of 10");
    leases.end_all();
    let back: Vec<u64> = leases.take_returns().iter().map(|r| r.tokens).collect();
    assert_eq!(back, [10]);
}

#[test]
fn memory_stays_within_the_cap_under_many_distinct_buckets() {
    let (mut leases, l) = (Leases::default(), limit(10, 10, 1_000));
    for i in 0..100_000u64 {
        let key = format!("rl:r:{i}");
        leases.wants(&key, &l, 1_000, i / 100);
        assert!(leases.len() <= MAX_ENTRIES);
        if i % 1_000 == 0 {
            leases.expire(i / 100);
        }
    }
    // Sightings expire with their ttl, making room again.
    leases.expire(10_000);
    assert!(leases.is_empty());
}

#[test]
fn the_tick_skips_the_scan_only_while_nothing_can_have_ended() {
    let (mut leases, l) = (Leases::default(), limit(100, 100, 1_000));
    leases.wants("slow", &l, 5_000, 0);
    leases.wants("fast", &l, 1_000, 0);
    leases.wants("fast", &l, 1_000, 0);
    leases.granted("fast", &l, &grant(4, 50), 1_000);
    leases.expire(999);
    assert!(leases.take_returns().is_empty());
    leases.expire(1_000);
    let back: Vec<u64> = leases.take_returns().iter().map(|r| r.tokens).collect();
    assert_eq!(
        back,
        [4],
        "the sooner lease ends on time behind a later one"
    );
    assert_eq!(leases.len(), 1);
    leases.expire(4_999);
    assert_eq!(leases.len(), 1);
    leases.expire(5_000);
    assert!(leases.is_empty());
}

#[test]
fn top_ups_out_across_a_reconfiguration_give_their_grant_back() {
    let mut old = Leases::default();
    let (sent, lacking) = low_lease(&mut old, "k", 4, 0);
    assert_eq!(lacking, 6);
    old.send_top_up(sent, "k line".into());
    let (unsent, _) = low_lease(&mut old, "j", 1, 0);
    // `sent` left in an exchange; the configuration changes before `unsent` does.
    let _ = old.take_top_ups();
    old.send_top_up(unsent, "j line".into());
    old.end_all();
    assert!(
        old.take_top_ups().is_empty(),
        "an unsent top-up never leaves"
    );
    let mut returned: Vec<u64> = old.take_returns().iter().map(|r| r.tokens).collect();
    returned.sort();
    assert_eq!(returned, [1, 4], "the leases' tokens go back");

    let mut new = Leases::default();
    new.adopt_top_ups(&mut old);
    new.topped_up(sent, Some(&grant(6, 40)));
    let back = new.take_returns();
    assert_eq!(back.len(), 1);
    assert_eq!((back[0].key.as_str(), back[0].tokens), ("k", 6));
    new.topped_up(unsent, Some(&grant(9, 40)));
    assert!(
        new.take_returns().is_empty(),
        "never sent: nothing was granted"
    );
    let (fresh, _) = low_lease(&mut new, "k", 1, 20);
    assert_ne!(fresh, sent, "ids stay unique across the two");
}

#[test]
fn a_top_up_whose_answer_never_comes_is_forgotten() {
    let mut leases = Leases::default();
    let (id, _) = low_lease(&mut leases, "k", 2, 0);
    leases.expire(999 + MAX_TIMEOUT_MS);
    assert_eq!(leases.topping.len(), 1, "an answer may still come");
    leases.expire(1_000 + MAX_TIMEOUT_MS);
    assert!(leases.topping.is_empty());
    leases.topped_up(id, Some(&grant(8, 40)));
    assert!(leases.is_empty() && leases.take_returns().len() == 1);
}
