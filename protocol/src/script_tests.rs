use super::*;

fn rule(key: &str, burst: u64, cost: u64) -> RuleSpec {
    RuleSpec::plain(key, burst, 1, 600, cost)
}

#[test]
fn script_replies_of_the_wrong_shape_are_errors() {
    assert!(decode(Mode::Check, &[], 0).is_err());
    assert!(decode(Mode::Check, &[1, 1, 2], 1).is_err());
    assert!(decode(Mode::Check, &[1, 1, 2, 3, 4], 1).is_err());
    assert!(decode(Mode::Check, &[1, -1, 2, 3], 1).is_err());
    assert!(decode(Mode::Check, &[-1], 0).is_err());
    assert!(decode(Mode::Check, &[1], usize::MAX).is_err());
    assert_eq!(decode(Mode::Check, &[7], 0).unwrap(), (7, vec![]));
}

#[test]
fn a_reply_is_read_as_little_endian_64_bit_integers() {
    let values = [0, 1, -1, -3, 1 << 53, i64::MIN, i64::MAX, 1_767_225_600_000];
    let packed: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(integers(&packed).unwrap(), values);
    assert_eq!(integers(&[]).unwrap(), Vec::<i64>::new());
    for len in [1, 7, 9, 15] {
        assert!(integers(&packed[..len]).is_err(), "{len} bytes");
    }
}

#[test]
fn a_rule_admits_when_it_has_nothing_to_wait_for() {
    let (now, rules) = decode(Mode::Check, &[5, 1, 2, 3, 4, 5, 0, -1, -1, -1], 3).unwrap();
    assert_eq!(now, 5);
    assert_eq!(
        rules,
        vec![
            Some(RuleResult {
                allowed: false,
                blocked: false,
                remaining: 1,
                full_ms: 2,
                wait_ms: 3,
                leased: 0,
                owed: 0,
                borrowed: 0,
                limit: 0,
            }),
            Some(RuleResult {
                allowed: true,
                blocked: false,
                remaining: 4,
                full_ms: 5,
                wait_ms: 0,
                leased: 0,
                owed: 0,
                borrowed: 0,
                limit: 0,
            }),
            None,
        ]
    );
}

#[test]
fn rules_sharing_parameters_send_them_once() {
    let checks = vec![
        vec![rule("a", 10, 1), rule("b", 5, 1)],
        vec![rule("c", 10, 1)],
    ];
    let parts = [Part::whole(0, 2), Part::whole(1, 1)];
    let layout = layout(&checks, &parts).unwrap();
    assert_eq!(layout.keys, ["a", "b", "c"]);
    assert_eq!(
        layout.shapes,
        [
            [10, 1, 600, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [5, 1, 600, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        ]
    );
    // Each part: its size and its rules' shapes.
    assert_eq!(layout.checks, [2, 1, 2, 1, 1]);
    let args = layout.args(Mode::Refund);
    let text: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(text[..3], [&b"refund"[..], b"2", b"10"]);
    assert_eq!(args.len(), 4 + 2 * SHAPE_LEN);
    assert_eq!(args[args.len() - 2], &[2, 1, 2, 1, 1]);
    assert_eq!(args.last().unwrap(), b"", "no settlement, no slot: no id");
    // Spread over slots: the same arguments, the mode marked, the keys after them.
    let spread = layout.spread_args(Mode::Check);
    assert_eq!(spread[0], b"check*");
    assert_eq!(spread[1..args.len()], args[1..]);
    let keys: Vec<&[u8]> = spread[args.len()..].iter().map(Vec::as_slice).collect();
    assert_eq!(keys, [&b"a"[..], b"b", b"c"]);
}

#[test]
fn an_override_is_part_of_its_rules_shape() {
    let plain = rule("a", 10, 1);
    let overridden = RuleSpec {
        overridden: Some(crate::Overridden {
            burst: 2,
            num: 1,
            den: 1_800_000,
            until_ms: 1_767_225_600_000,
        }),
        ..rule("b", 10, 1)
    };
    assert_eq!(shape(&plain)[9..13], [0, 0, 0, 0]);
    assert_eq!(
        shape(&overridden)[9..13],
        [2, 1, 1_800_000, 1_767_225_600_000]
    );
    let checks = vec![vec![plain, overridden]];
    let layout = layout(&checks, &[Part::whole(0, 2)]).unwrap();
    assert_eq!(
        layout.shapes.len(),
        2,
        "an override makes a shape of its own"
    );
}

#[test]
fn a_call_past_the_byte_limits_is_refused() {
    let many: Vec<RuleSpec> = (0..=MAX_PART_RULES as u64)
        .map(|i| rule(&format!("k{i}"), 1 + i, 1))
        .collect();
    let all = Part::whole(0, many.len());
    let checks = vec![many];
    assert!(layout(&checks, std::slice::from_ref(&all)).is_err());
    // 256 one-rule parts, each of its own shape.
    let parts: Vec<Part> = (0..=MAX_SHAPES)
        .map(|i| Part {
            check: 0,
            rules: vec![i],
        })
        .collect();
    assert!(layout(&checks, &parts).is_err());
    assert!(layout(&checks, &parts[..MAX_SHAPES]).is_ok());
}

fn settled(key: &str, delta: i64, id: &str) -> RuleSpec {
    RuleSpec {
        cost: 0,
        settle: Some(crate::Settle {
            delta,
            debt: 50,
            id: id.into(),
        }),
        ..rule(key, 10, 0)
    }
}

#[test]
fn a_settlement_call_sends_its_signed_deltas_debts_and_one_id_per_part() {
    let checks = vec![
        vec![settled("a", -3, "s1"), settled("b", 7, "s1")],
        vec![settled("c", -3, "s2")],
    ];
    let parts = [Part::whole(0, 2), Part::whole(1, 1)];
    let layout = layout(&checks, &parts).unwrap();
    assert_eq!(
        layout.shapes,
        [
            [10, 1, 600, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 50, 0, 0, 0, 0, 0],
            [10, 1, 600, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 50, 0, 0, 0, 0, 0]
        ]
    );
    let args = layout.args(Mode::Settle);
    assert_eq!(args[0], b"settle");
    assert_eq!(args[5], b"-3");
    assert_eq!(args.len(), 4 + 2 * SHAPE_LEN);
    assert_eq!(args.last().unwrap(), b"s1 s2 ");
    let spread = layout.spread_args(Mode::Settle);
    assert_eq!(spread[0], b"settle*");
    assert_eq!(spread[args.len() - 1], b"s1 s2 ");
    assert_eq!(spread[args.len()..].len(), 3);
}

#[test]
fn slots_send_their_life_in_the_shape_and_their_ids_after_any_settlements() {
    let slotted = |key: &str, id: &str| RuleSpec {
        slot: Some(crate::slot::Slot {
            ttl_ms: 30_000,
            id: id.into(),
        }),
        ..rule(key, 5, 1)
    };
    let checks = vec![
        vec![rule("a", 10, 1), slotted("s:a", "r1")],
        vec![slotted("s:b", "r2"), slotted("s:c", "r2")],
    ];
    let checked = layout(&checks, &[Part::whole(0, 2), Part::whole(1, 2)]).unwrap();
    assert_eq!(shape(&checks[0][1])[14], 30_000);
    assert_eq!(shape(&checks[0][0])[14], 0);
    assert_eq!(checked.args(Mode::Check).last().unwrap(), b"r1 r2 r2 ");
    let settled = vec![vec![RuleSpec {
        settle: Some(crate::Settle {
            delta: 0,
            debt: 0,
            id: "r1".into(),
        }),
        ..slotted("s:a", "r1")
    }]];
    let renewed = layout(&settled, &[Part::whole(0, 1)]).unwrap();
    assert_eq!(renewed.args(Mode::Settle).last().unwrap(), b"r1 r1 ");
}

#[test]
fn a_settlement_reply_tells_what_a_bucket_holds_from_what_it_owes() {
    let (now, rules) = decode(Mode::Settle, &[9, 1, 4, 0, 1, -12, 5, 0, -1, 0], 3).unwrap();
    assert_eq!(now, 9);
    let read: Vec<(u64, u64, u64)> = rules
        .iter()
        .map(|r| r.map(|r| (r.remaining, r.owed, r.borrowed)).unwrap())
        .collect();
    // Applied, leaving 4; applied, owing 12 of which it borrowed 5; found applied before.
    assert_eq!(read, [(4, 0, 0), (0, 12, 5), (0, 1, 0)]);
    assert_eq!(decode(Mode::Settle, &[9, -1, -1, -1], 1).unwrap().1, [None]);
    assert!(decode(Mode::Settle, &[9, 1, 4, -2], 1).is_err());
}

#[test]
fn a_read_sends_an_empty_id_list_and_its_reply_tells_the_level_signed_and_the_block_left() {
    let checks = vec![vec![rule("a", 10, 0)]];
    let layout = layout(&checks, &[Part::whole(0, 1)]).unwrap();
    let args = layout.args(Mode::Read);
    assert_eq!(
        (args[0].as_slice(), args.len()),
        (&b"read"[..], 4 + SHAPE_LEN)
    );
    assert_eq!(layout.spread_args(Mode::Read)[0], b"read*");
    let (now, rules) = decode(
        Mode::Read,
        &[9, 600, 4, 0, 9000, -12, 0, 1200, 0, 30_000],
        3,
    )
    .unwrap();
    assert_eq!(now, 9);
    let read: Vec<(bool, bool, u64, u64, u64, u64)> = rules
        .iter()
        .map(|r| {
            r.map(|r| {
                (
                    r.allowed,
                    r.blocked,
                    r.remaining,
                    r.owed,
                    r.full_ms,
                    r.wait_ms,
                )
            })
        })
        .map(Option::unwrap)
        .collect();
    // 4 left; owing 12 (full in 9 s); empty, and blocked for 30 s more.
    assert_eq!(
        read,
        [
            (true, false, 4, 0, 600, 0),
            (true, false, 0, 12, 9000, 0),
            (false, true, 0, 0, 1200, 30_000)
        ]
    );
    // A level of -1 is a debt, not a foreign value, unless all three are -1.
    assert_eq!(
        decode(Mode::Read, &[9, 60, -1, 0], 1).unwrap().1[0]
            .unwrap()
            .owed,
        1
    );
    assert_eq!(decode(Mode::Read, &[9, -1, -1, -1], 1).unwrap().1, [None]);
    assert!(decode(Mode::Read, &[9, -5, 4, 0], 1).is_err());
    assert!(decode(Mode::Read, &[9, 5, 4, -7], 1).is_err());
}
