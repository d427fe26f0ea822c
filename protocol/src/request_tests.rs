use super::*;

const BLOCK: Block = Block {
    after: 3,
    within_ms: 60_000,
    for_ms: 900_000,
};

fn encode(checks: &[&[RuleSpec]]) -> String {
    let mut body = String::new();
    for check in checks {
        for (i, rule) in check.iter().enumerate() {
            encode_rule(&mut body, i == 0, rule.spec_ref());
        }
        end_check(&mut body);
    }
    body
}

#[test]
fn what_the_filter_encodes_the_bridge_parses() {
    let leasing = RuleSpec {
        lease: 3,
        ..RuleSpec::plain("rl:g", 5, 50, 1, 2)
    };
    let blocking = RuleSpec {
        block: Some(BLOCK),
        ..RuleSpec::plain("rl:b", 1, 1, 1, 1)
    };
    let shadow = RuleSpec {
        shadow: true,
        ..RuleSpec::plain("rl:s", 2, 1, 1, 1)
    };
    let checks = [
        vec![RuleSpec::plain("rl:a:x", 10, 1, 6000, 1), leasing],
        vec![blocking, shadow],
    ];
    let body = encode(&[&checks[0], &checks[1]]);
    assert_eq!(
        body,
        "rl:a:x,10,1,6000,1 rl:g,5,50,1,2+3\nrl:b,1,1,1,1,3,60000,900000 ~rl:s,2,1,1,1\n"
    );
    let parsed: Vec<Vec<RuleSpec>> = parse_batch(body.as_bytes())
        .unwrap()
        .into_iter()
        .map(|line| line.unwrap().rules)
        .collect();
    assert_eq!(parsed, checks);

    let mut lease_return = String::new();
    start_lease_return(&mut lease_return);
    encode_rule(
        &mut lease_return,
        true,
        RuleSpec::plain("rl:g", 5, 50, 1, 4).spec_ref(),
    );
    end_check(&mut lease_return);
    assert_eq!(lease_return, "+ rl:g,5,50,1,4\n");
    let line = parse_batch(lease_return.as_bytes())
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(line.kind == LineKind::LeaseReturn && line.rules[0].cost == 4);

    // A lease asked for alone, ahead of need: cost 0.
    let top_up = RuleSpec {
        lease: 7,
        ..RuleSpec::plain("rl:g", 50, 1, 1, 0)
    };
    let body = encode(&[std::slice::from_ref(&top_up)]);
    assert_eq!(body, "rl:g,50,1,1,0+7\n");
    let line = parse_batch(body.as_bytes()).unwrap().remove(0).unwrap();
    assert_eq!(line.rules, [top_up]);
}

#[test]
fn a_bad_line_fails_alone_with_a_reason() {
    let long_key = format!("{},1,1,1,1", "k".repeat(MAX_KEY_LEN + 1));
    let too_many_rules = (0..=MAX_RULES)
        .map(|i| format!("k{i},1,1,1,1"))
        .collect::<Vec<_>>()
        .join(" ");
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "bad key"),
        ("k,1,1,1".into(), "cost"),
        ("k,1,1,1,1,1".into(), "extra"),
        ("k,1,1,1,1,1,1".into(), "a block needs"),
        ("k,1,1,1,1,1,1,0".into(), "for"),
        ("k,1,1,1,1,1,1,1,1".into(), "extra"),
        ("k,1,1,1,1+2".into(), "lease"),
        ("k,2,1,1,1+x".into(), "cost"),
        ("k,2,1,1+1,1".into(), "den"),
        ("+ k,2,1,1,1+1".into(), "refund takes no lease"),
        ("+ k,2,1,1,0+1".into(), "refund takes no lease"),
        ("k,2,1,1,0".into(), "cost"),
        ("k,2,1,1,0+0".into(), "cost"),
        ("k,2,1,1,00+1".into(), "cost"),
        ("~".into(), "bad key"),
        ("~~k,1,1,1,1".into(), "bad key"),
        ("k,0,1,1,1".into(), "burst"),
        ("k,1,1,1,2".into(), "exceeds"),
        ("k,1,x,1,1".into(), "num"),
        ("k,100000000,1,100000000,1".into(), "2^53"),
        ("k,9007199254740992,1,1,1".into(), "burst"),
        ("k,1,1,1,1 k,1,1,1,1".into(), "twice"),
        ("k,1,1,1,1  j,1,1,1,1".into(), "bad key"),
        (long_key, "bad key"),
        (too_many_rules, "rules"),
    ];
    for (line, expect) in cases {
        let body = format!("ok,1,1,1,1\n{line}\nok2,1,1,1,1\n");
        let checks = parse_batch(body.as_bytes()).unwrap();
        assert_eq!(checks.len(), 3, "{line:?}");
        assert!(checks[0].is_ok() && checks[2].is_ok(), "{line:?}");
        let e = checks[1].as_ref().unwrap_err();
        assert!(
            e.starts_with("check 2: ") && e.contains(expect),
            "{line:?}: {e}"
        );
    }
}

#[test]
fn an_unreadable_body_fails_the_exchange() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "no check"),
        (b"\xff,1,1,1,1".to_vec(), "UTF-8"),
        ("k,1,1,1,1\n".repeat(MAX_CHECKS + 1).into_bytes(), "checks"),
        (vec![b'k'; MAX_BODY + 1], "body over"),
    ];
    for (body, expect) in cases {
        let e = parse_batch(&body).unwrap_err();
        assert!(e.0.contains(expect), "{e}");
    }
}

#[test]
fn the_longest_legal_check_fits_a_body_many_times() {
    let big = MAX_EXACT - 1;
    let rule = RuleSpec {
        lease: big,
        block: Some(Block {
            after: big,
            within_ms: big,
            for_ms: big,
        }),
        shadow: true,
        ..RuleSpec::plain("k".repeat(MAX_KEY_LEN), big, big, 1, 1)
    };
    let mut body = String::new();
    for i in 0..MAX_RULES {
        encode_rule(&mut body, i == 0, rule.spec_ref());
    }
    end_check(&mut body);
    assert!(body.len() * 8 < MAX_BODY, "{}", body.len());
}

fn settling(key: &str, delta: i64, debt: u64) -> RuleSpec {
    RuleSpec {
        cost: 0,
        settle: Some(Settle {
            delta,
            debt,
            id: "g1-7".into(),
        }),
        ..RuleSpec::plain(key, 100, 1, 600, 0)
    }
}

#[test]
fn a_settlement_line_carries_its_id_and_signed_deltas_and_reads_back_as_written() {
    let rules = [
        settling("rl:tokens:k1", -37, 0),
        RuleSpec {
            block: Some(BLOCK),
            shadow: true,
            ..settling("rl:team:t", 120, 5000)
        },
        settling("rl:x", 0, 0),
    ];
    let mut body = String::new();
    start_settlement(&mut body, "g1-7");
    for (i, rule) in rules.iter().enumerate() {
        encode_rule(&mut body, i == 0, rule.spec_ref());
    }
    end_check(&mut body);
    assert_eq!(
        body,
        "= g1-7 rl:tokens:k1,100,1,600,-37,0 ~rl:team:t,100,1,600,120,5000,3,60000,900000 \
         rl:x,100,1,600,0,0\n"
    );
    let line = parse_batch(body.as_bytes()).unwrap().remove(0).unwrap();
    assert_eq!(line.kind, LineKind::Settlement);
    assert_eq!(line.rules, rules);
}

#[test]
fn settlement_lines_that_break_a_bound_are_refused_alone() {
    for bad in [
        "= rl:a,100,1,600,5,0",                   // no id
        "= bad.id rl:a,100,1,600,5,0",            // not an id's characters
        "= g1 rl:a,100,1,600,5",                  // no debt
        "= g1 rl:a,100,1,600,5+3,0",              // a lease
        "= g1 rl:a,100,1,600,--5,0",              // not a number
        "= g1 rl:a,100,1,600,5,-1",               // a negative debt
        "= g1 rl:a,100,1,600,-101,0",             // more given back than a burst
        "= g1 rl:a,100,1,600,151,50",             // more taken than burst and debt
        "= g1 rl:a,100,1,600,5,9007199254740992", // a debt of 2^53
        "= g1 rl:a,100,1,1,5,9007199254740900",   // burst + debt past 2^53
        "= g1 rl:a,100,1,600,5,0,3,60000",        // half a block
    ] {
        let body = format!("{bad}\nrl:ok,1,1,1,1\n");
        let lines = parse_batch(body.as_bytes()).unwrap();
        assert!(lines[0].is_err(), "{bad}");
        assert!(lines[1].is_ok(), "{bad}");
    }
    let long = format!(
        "= {} rl:a,100,1,600,5,0",
        "i".repeat(MAX_SETTLEMENT_ID_LEN + 1)
    );
    assert!(parse_batch(long.as_bytes()).unwrap()[0].is_err());
}

#[test]
fn a_slot_travels_on_its_rule_and_only_as_a_slot_can() {
    let slotted = RuleSpec {
        slot: Some(crate::slot::Slot {
            ttl_ms: 30_000,
            id: "ab12-7".into(),
        }),
        ..RuleSpec::plain("rl:streams:u", 20, 2, 3000, 1)
    };
    let body = encode(&[&[RuleSpec::plain("rl:a:x", 10, 1, 6000, 1), slotted.clone()]]);
    assert_eq!(
        body,
        "rl:a:x,10,1,6000,1 rl:streams:u,20,2,3000,1|30000|ab12-7\n"
    );
    let parsed = parse_batch(body.as_bytes()).unwrap().remove(0).unwrap();
    assert_eq!(parsed.rules[1], slotted);
    // Released by a lease return, renewed by a settlement of nothing.
    for line in [
        "+ rl:streams:u,20,2,3000,1|30000|ab12-7\n",
        "= ab12-7 rl:streams:u,20,2,3000,0,0|30000|ab12-7\n",
    ] {
        let parsed = parse_batch(line.as_bytes()).unwrap().remove(0).unwrap();
        assert_eq!(parsed.rules[0].slot, slotted.slot, "{line}");
    }
    for bad in [
        "rl:s:u,20,2,3000,2|30000|a",
        "rl:s:u,20,2,3000,1+3|30000|a",
        "rl:s:u,20,2,3000,1,3,60000,900000|30000|a",
        "rl:s:u,20,2,3000,1^,0,2000|30000|a",
        "= a rl:s:u,20,2,3000,1,0|30000|a",
        "rl:s:u,20,2,3000,1|30000|",
        "rl:s:u,20,2,3000,1|30000|a|b",
        "rl:s:u,20,2,3000,1|5|a",
    ] {
        let parsed = parse_batch(bad.as_bytes()).unwrap().remove(0);
        assert!(parsed.is_err(), "{bad}: {parsed:?}");
    }
}

#[test]
fn only_a_shadow_rule_may_cost_0_a_look() {
    let look = parse_batch(b"~rl:a:x,10,1,600,0 ~rl:s:x,4,1,7500,0|30000|look\n")
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        look.rules
            .iter()
            .map(|r| (r.cost, r.shadow))
            .collect::<Vec<_>>(),
        [(0, true), (0, true)]
    );
    for bad in ["rl:a:x,10,1,600,0", "rl:s:x,4,1,7500,0|30000|a"] {
        let parsed = parse_batch(bad.as_bytes()).unwrap().remove(0);
        assert!(parsed.is_err(), "{bad}: {parsed:?}");
    }
}

#[test]
fn a_calendar_quota_travels_with_its_period_and_zone_and_no_refill() {
    let monthly = RuleSpec {
        calendar: Some(Calendar {
            period: Period::Month,
            zone: "Europe/Paris".into(),
        }),
        block: Some(BLOCK),
        ..RuleSpec::plain("rl:monthly:alice", 1_000_000, 0, 1, 3)
    };
    let body = encode(&[&[monthly.clone(), RuleSpec::plain("rl:r", 5, 1, 1, 1)]]);
    assert_eq!(
        body,
        "rl:monthly:alice,1000000,0,1,3,3,60000,900000&month@Europe/Paris rl:r,5,1,1,1\n"
    );
    let parsed = parse_batch(body.as_bytes()).unwrap();
    assert_eq!(parsed[0].as_ref().unwrap().rules[0], monthly);
    for (line, why) in [
        ("rl:q,5,1,1,1&day@UTC", "refilling"),
        ("rl:q,5,0,2,1&day@UTC", "refilling"),
        ("rl:q,5,0,1,1+2&day@UTC", "leased"),
        ("rl:q,5,0,1,1^eu,100,2000&day@UTC", "global"),
        ("rl:q,5,0,1,1", "num"),
        ("rl:q,5,0,1,1&day@Mars.Base", "time zone"),
        ("rl:q,5,0,1,1&fortnight@UTC", "period"),
    ] {
        let parsed = parse_batch(line.as_bytes()).unwrap();
        let err = parsed[0].as_ref().unwrap_err();
        assert!(err.contains(why), "{line}: {err}");
    }
}
