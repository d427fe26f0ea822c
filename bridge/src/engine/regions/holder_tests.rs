use super::*;

const TTL: u64 = 2_000;

/// A holder that gives up 1 % of a lease's life, with one lease of `tokens` of key `k`
/// asked at `at_ms`.
fn holding(tokens: u64, at_ms: u64) -> (Holder<()>, u64) {
    let mut h = Holder::new(10_000);
    let ask = h.ask("k", 1, TTL, 1_000, at_ms, || ()).unwrap();
    assert!(h.granted("k", ask.seq, tokens, 100, TTL, at_ms + 50));
    (h, ask.seq)
}

#[test]
fn a_lease_lives_its_life_less_the_drift_counted_from_its_ask() {
    let (mut h, _) = holding(10, 1_000);
    // Asked at 1,000 for 2 s, 1 % given up: spendable until 2,980, not after.
    assert!(h.take("k", 1, 2_979).is_some());
    assert!(h.take("k", 1, 2_980).is_none());
    assert_eq!(h.live("k", 2_980), 0);
    let ended = h.expire(2_980, 60_000);
    assert_eq!(
        ended,
        vec![Ended {
            key: "k".into(),
            seq: 1,
            left: 9,
            about: ()
        }]
    );
    // A grant whose life is over by the time it comes is no lease.
    let ask = h.ask("k", 1, TTL, 1_000, 3_000, || ()).unwrap();
    assert!(!h.granted("k", ask.seq, 5, 100, TTL, 5_000));
    assert_eq!(h.live("k", 5_000), 0);
}

#[test]
fn takes_are_all_or_nothing_from_the_lease_that_expires_first_and_go_back_if_denied() {
    let (mut h, first) = holding(3, 0);
    assert_eq!(
        h.ask("k", 1, TTL, 1_000, 500, || ()),
        None,
        "plenty for now"
    );
    // Half the first lease's life gone: one more is asked ahead.
    let ask = h.ask("k", 1, TTL, 1_000, 1_500, || ()).unwrap();
    assert!(h.granted("k", ask.seq, 4, 100, TTL, 1_600));
    let taken = h.take("k", 5, 1_700).unwrap();
    assert_eq!(taken.parts, vec![(first, 3), (ask.seq, 2)]);
    assert!(h.take("k", 3, 1_700).is_none(), "2 left, all or nothing");
    h.refund("k", &taken, 1_800);
    assert_eq!(h.live("k", 1_800), 7);
    // Past the first lease's end, what goes back to it is gone with it.
    let taken = h.take("k", 5, 1_900).unwrap();
    h.refund("k", &taken, 1_990);
    assert_eq!(h.live("k", 1_990), 4);
}

#[test]
fn asks_are_one_at_a_time_at_most_two_leases_and_sized_on_the_spending() {
    let mut h: Holder<()> = Holder::new(0);
    let ask = h.ask("k", 3, TTL, 1_000, 0, || ()).unwrap();
    assert_eq!(ask.tokens, 3, "a cold key asks for its cost");
    assert_eq!(
        h.ask("k", 3, TTL, 1_000, 10, || ()),
        None,
        "one ask out at a time"
    );
    assert!(h.granted("k", ask.seq, 3, 100, TTL, 20));
    // 100 tokens a second for 2 s: leases sized on that, at most `most`.
    let mut now = 20;
    for _ in 0..100 {
        now += 10;
        if h.take("k", 1, now).is_none() {
            let ask = h.ask("k", 1, TTL, 1_000, now, || ()).unwrap();
            assert!(h.granted("k", ask.seq, ask.tokens, 100, TTL, now));
            assert!(h.take("k", 1, now).is_some());
        }
        if let Some(ask) = h.ask("k", 1, TTL, 1_000, now, || ()) {
            assert!(ask.tokens > 1 && ask.tokens <= 1_000, "{ask:?}");
            assert!(h.granted("k", ask.seq, ask.tokens, 100, TTL, now));
        }
        let live = h.keys["k"]
            .leases
            .iter()
            .filter(|l| l.expires_ms > now && l.left > 0);
        assert!(live.count() <= MAX_LIVE);
    }
    // Spending fast: the next lease is sized on it, at most `most`.
    let mut fast: Holder<()> = Holder::new(0);
    let ask = fast.ask("k", 1, TTL, 150, 0, || ()).unwrap();
    assert!(fast.granted("k", ask.seq, 1_000, 100, TTL, 0));
    assert!(fast.take("k", 900, 100).is_some());
    let ask = fast.ask("k", 1, TTL, 150, 200, || ()).unwrap();
    assert_eq!(ask.tokens, 150, "at most `most`");
}

#[test]
fn a_refused_ask_keeps_quiet_until_told_and_a_check_waits_only_while_home_has_tokens() {
    let mut h: Holder<()> = Holder::new(0);
    let ask = h.ask("k", 1, TTL, 10, 0, || ()).unwrap();
    assert!(
        h.worth_waiting("k"),
        "cold: the first grant is worth waiting for"
    );
    assert!(!h.granted("k", ask.seq, 0, 0, TTL, 10), "nothing granted");
    h.quiet("k", ask.seq, 500);
    assert!(!h.worth_waiting("k"), "no ask out");
    assert_eq!(h.ask("k", 1, TTL, 10, 499, || ()), None);
    let ask = h.ask("k", 1, TTL, 10, 500, || ()).unwrap();
    assert!(
        !h.worth_waiting("k"),
        "the ledger said it was dry: deny at once"
    );
    assert!(h.granted("k", ask.seq, 1, 7, TTL, 510));
    // A late answer to an ask that is not the one out changes nothing.
    assert!(!h.granted("k", ask.seq, 1, 7, TTL, 520));
    h.take("k", 1, 530).unwrap();
    let ask = h.ask("k", 1, TTL, 10, 540, || ()).unwrap();
    assert!(
        h.worth_waiting("k"),
        "home had 7 left: the lease was small, not the budget"
    );
    assert!(h.granted("k", ask.seq, 1, 0, TTL, 550));
    h.take("k", 1, 560).unwrap();
    h.ask("k", 1, TTL, 10, 570, || ()).unwrap();
    assert!(!h.worth_waiting("k"), "home had none left");
}

#[test]
fn idle_keys_go_and_a_drain_gives_every_lease_back() {
    let (mut h, seq) = holding(5, 0);
    assert!(h.expire(100, 1_000).is_empty());
    let ended = h.drain();
    assert_eq!(
        ended,
        vec![Ended {
            key: "k".into(),
            seq,
            left: 5,
            about: ()
        }]
    );
    assert_eq!(h.live("k", 100), 0);
    let (mut h, _) = holding(5, 0);
    h.take("k", 5, 10).unwrap();
    assert!(
        h.expire(2_000, 1_000).is_empty(),
        "spent, nothing to return"
    );
    assert!(h.keys.is_empty(), "idle and empty: forgotten");
}

#[test]
fn a_spent_lease_goes_back_at_once_and_a_refund_to_it_is_lost() {
    let (mut h, seq) = holding(2, 0);
    h.take("k", 2, 10).unwrap();
    let ended = h.expire(20, 1_000);
    assert_eq!(
        ended,
        vec![Ended {
            key: "k".into(),
            seq,
            left: 0,
            about: ()
        }],
        "spent while it lives: returned, so the ledger refills again"
    );
    h.refund(
        "k",
        &Taken {
            parts: vec![(seq, 1)],
        },
        30,
    );
    assert_eq!(
        h.live("k", 30),
        0,
        "a refund to a lease returned mints nothing"
    );
    let (mut h, _) = holding(2, 0);
    h.take("k", 2, 10).unwrap();
    assert!(
        h.expire(TTL, 1_000_000).is_empty(),
        "spent and over here before a tick saw it: the ledger ends it as soon"
    );
}
