use super::*;
use crate::check::RuleSpec;

fn rule(key: &str) -> RuleSpec {
    RuleSpec::plain(key, 1, 1, 1, 1)
}

/// Whether `call` goes to `{y}`'s slot (its first rule is there).
fn in_slot_y(checks: &[Check], call: &Call) -> bool {
    checks[call.parts[0].check][call.parts[0].rules[0]]
        .key
        .starts_with("{y}")
}

fn outcome(allowed: bool) -> ScriptOutcome {
    Some(RuleOutcome {
        allowed,
        blocked: false,
        remaining: 0,
        full_ms: 1,
        wait_ms: u64::from(!allowed),
        leased: 0,
    })
}

#[test]
fn a_single_server_gets_the_whole_batch_in_one_call() {
    let checks = vec![vec![rule("a"), rule("b")], vec![], vec![rule("a")]];
    let calls = plan(&checks, false);
    assert_eq!(calls.len(), 1);
    let shape: Vec<(usize, Vec<usize>)> = calls[0]
        .parts
        .iter()
        .map(|p| (p.check, p.rules.clone()))
        .collect();
    assert_eq!(shape, [(0, vec![0, 1]), (1, vec![]), (2, vec![0])]);
}

#[test]
fn large_batches_are_cut_between_checks() {
    let checks: Vec<Check> = (0..MAX_KEYS_PER_CALL)
        .map(|i| vec![rule(&format!("{i}a")), rule(&format!("{i}b"))])
        .collect();
    let calls = plan(&checks, false);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c.rules() == MAX_KEYS_PER_CALL));
    assert_eq!(calls[1].parts[0].check, MAX_KEYS_PER_CALL / 2);
}

#[test]
fn a_call_names_at_most_255_shapes_and_an_oversized_check_goes_alone() {
    let shaped = |i: u64| RuleSpec {
        burst: 1 + i,
        ..rule(&format!("s{i}"))
    };
    let mut checks: Vec<Check> = (0..300).map(|i| vec![shaped(i)]).collect();
    checks.push((0..300).map(|i| rule(&format!("big{i}"))).collect());
    checks.push(vec![rule("after")]);
    let calls = plan(&checks, false);
    let sizes: Vec<usize> = calls.iter().map(|c| c.parts.len()).collect();
    assert_eq!(sizes, [255, 45, 1, 1]);
    assert_eq!(calls[2].parts[0].check, 300);
}

#[test]
fn a_cluster_gets_one_call_per_slot_in_batch_order() {
    // {x} and {y} are different slots; a check with rules in both has two parts.
    let checks = vec![
        vec![rule("{x}1"), rule("{y}1")],
        vec![rule("{y}2")],
        vec![rule("{x}3"), rule("{x}4")],
    ];
    let calls = plan(&checks, true);
    assert_eq!(calls.len(), 2);
    for call in &calls {
        let slots: Vec<u16> = call
            .parts
            .iter()
            .flat_map(|p| {
                p.rules
                    .iter()
                    .map(|&r| slot(checks[p.check][r].key.as_bytes()))
            })
            .collect();
        assert!(slots.windows(2).all(|w| w[0] == w[1]), "{call:?}");
        assert!(call.parts.windows(2).all(|w| w[0].check < w[1].check));
    }
    assert_eq!(calls.iter().map(Call::rules).sum::<usize>(), 5);
}

#[test]
fn a_check_denied_in_one_slot_refunds_the_others() {
    let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{x}2")]];
    let calls = plan(&checks, true);
    let mut tally = Tally::new(&checks);
    for call in &calls {
        // {y} denies; {x} admits everything.
        let y = call.parts[0]
            .rules
            .iter()
            .any(|&r| checks[call.parts[0].check][r].key.starts_with("{y}"));
        let n = call.rules();
        tally.checked(call, Ok((7, vec![outcome(!y); n])));
    }
    let refunds = tally.refunds();
    assert_eq!(
        refunds,
        [Part {
            check: 0,
            rules: vec![0]
        }]
    );
    assert!(tally.refunds().is_empty(), "refunded once");
    let refund_calls = group(&checks, refunds, true);
    assert_eq!(refund_calls.len(), 1);
    tally.refunded(&refund_calls[0], Ok((8, vec![outcome(true)])));
    let out = tally.finish();
    let (now, rules) = out[0].clone().unwrap();
    assert_eq!(now, 7);
    assert!(rules[0].allowed && !rules[1].allowed);
    assert!(out[1].as_ref().unwrap().1[0].allowed);
}

#[test]
fn a_failed_call_fails_its_checks_and_refunds_their_other_parts() {
    let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{x}2")]];
    let calls = plan(&checks, true);
    let mut tally = Tally::new(&checks);
    for call in &calls {
        let y = in_slot_y(&checks, call);
        let reply = if y {
            Err("down".to_string())
        } else {
            Ok((7, vec![outcome(true); call.rules()]))
        };
        tally.checked(call, reply);
    }
    assert_eq!(tally.refunds().len(), 1);
    let out = tally.finish();
    assert_eq!(out[0], Err("down".into()));
    assert!(out[1].is_ok());
}

#[test]
fn a_foreign_value_fails_its_check_and_refunds_its_other_parts() {
    let checks = vec![vec![rule("{x}1"), rule("{y}1")], vec![rule("{y}2")]];
    let calls = plan(&checks, true);
    let mut tally = Tally::new(&checks);
    for call in &calls {
        let y = in_slot_y(&checks, call);
        // On y's node, the first check's key holds a foreign value.
        let outcomes = call
            .parts
            .iter()
            .map(|p| {
                if y && p.check == 0 {
                    None
                } else {
                    outcome(true)
                }
            })
            .collect();
        tally.checked(call, Ok((7, outcomes)));
    }
    assert_eq!(tally.refunds().len(), 1, "x's part gives its token back");
    let out = tally.finish();
    assert_eq!(out[0], Err(FOREIGN_VALUE.into()));
    assert!(out[1].is_ok());
}

#[test]
fn checks_spanning_calls_peek_and_only_the_undecided_ones_take() {
    let checks = vec![
        vec![rule("{x}1"), rule("{y}1")],
        vec![rule("{x}2")],
        vec![rule("{x}3"), rule("{y}3")],
    ];
    let calls = plan(&checks, true);
    assert_eq!(spanning(checks.len(), &calls), [true, false, true]);
    let peeks = only(&calls, |c| c != 1);
    assert!(peeks
        .iter()
        .all(|call| call.parts.iter().all(|p| p.check != 1)));
    let mut tally = Tally::new(&checks);
    for call in &peeks {
        let y = in_slot_y(&checks, call);
        // y's slot would deny the third check.
        let outcomes = call
            .parts
            .iter()
            .map(|p| outcome(!(y && p.check == 2)))
            .collect();
        tally.peeked(call, Ok((7, outcomes)));
    }
    assert_eq!(
        (tally.decided(0), tally.decided(1), tally.decided(2)),
        (false, false, true)
    );
    let takes = only(&calls, |c| !tally.decided(c));
    let taking: Vec<usize> = takes
        .iter()
        .flat_map(|call| call.parts.iter().map(|p| p.check))
        .collect();
    assert!(!taking.contains(&2) && taking.contains(&0) && taking.contains(&1));
    for call in &takes {
        tally.checked(call, Ok((8, vec![outcome(true); call.rules()])));
    }
    assert!(tally.refunds().is_empty(), "the denied check took nothing");
    let out = tally.finish();
    assert!(out[0].as_ref().unwrap().1.iter().all(|r| r.allowed));
    assert!(!out[2].as_ref().unwrap().1.iter().all(|r| r.allowed));
    assert!(spanning(1, &plan(&[vec![rule("a"), rule("b")]], false)) == [false]);
}
