use super::*;
use crate::store::calls::batch::{group, plan};
use crate::store::calls::commit::CallError;
use crate::store::fakes::{rule, two_nodes};
use ratelimit_protocol::script::ScriptOutcome;

fn outcome(allowed: bool) -> ScriptOutcome {
    Some(RuleOutcome {
        allowed,
        blocked: false,
        remaining: 0,
        full_ms: 1,
        wait_ms: u64::from(!allowed),
        leased: 0,
        owed: 0,
        borrowed: 0,
        limit: 0,
    })
}

/// Answers every part of `call`: each rule as `answer` says for its key.
fn answer(checks: &[Check], call: &Call, answer: impl Fn(&str) -> ScriptOutcome) -> Vec<PartReply> {
    call.parts
        .iter()
        .map(|p| {
            let rules = p
                .rules
                .iter()
                .map(|&r| answer(&checks[p.check][r].key))
                .collect();
            Ok((7, rules))
        })
        .collect()
}

#[test]
fn a_check_denied_on_one_node_gives_back_only_its_own_buckets_elsewhere() {
    let checks = vec![
        vec![
            rule("rl:u:{b}1", 5),
            rule("rl:ip:{x}1", 5),
            rule("rl:global{c}", 9),
        ],
        vec![rule("rl:u:{b}2", 5)],
    ];
    let plan = plan(&checks, &two_nodes());
    let mut tally = Tally::new(&checks);
    for call in &group(&checks, plan.first) {
        // The IP bucket on B denies; everything on A admits.
        tally.checked(call, answer(&checks, call, |k| outcome(!k.contains("{x}"))));
    }
    assert!(tally.decided(0) && !tally.decided(1));
    let refunds = tally.refunds();
    let given: Vec<(usize, usize, Vec<usize>)> = refunds
        .iter()
        .map(|(n, p)| (*n, p.check, p.rules.clone()))
        .collect();
    assert_eq!(
        given,
        [(0, 0, vec![0])],
        "the user's own bucket, never the global one"
    );
    assert!(tally.refunds().is_empty(), "given back once");
    let out = tally.finish();
    let (now, rules) = out[0].clone().unwrap();
    assert_eq!(now, 7);
    assert_eq!(
        rules.iter().map(|r| r.allowed).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(
        rules[2].remaining, 9,
        "the unreached global rule reports its capacity"
    );
    assert!(out[1].as_ref().unwrap().1[0].allowed);
}

#[test]
fn a_failed_call_fails_its_checks_and_gives_back_their_other_parts() {
    let checks = vec![
        vec![rule("rl:u:{b}1", 5), rule("rl:ip:{x}1", 5)],
        vec![rule("rl:u:{b}2", 5)],
    ];
    let plan = plan(&checks, &two_nodes());
    let mut tally = Tally::new(&checks);
    for call in &group(&checks, plan.first) {
        let replies = if call.node == 1 {
            vec![Err(CallError::Failed("down".into())); call.parts.len()]
        } else {
            answer(&checks, call, |_| outcome(true))
        };
        tally.checked(call, replies);
    }
    assert_eq!(tally.refunds().len(), 1);
    let out = tally.finish();
    assert_eq!(out[0], Err("down".into()));
    assert!(out[1].is_ok());
}

#[test]
fn a_foreign_value_fails_its_check_and_gives_back_its_other_parts() {
    let checks = vec![
        vec![rule("rl:u:{b}1", 5), rule("rl:ip:{x}1", 5)],
        vec![rule("rl:ip:{x}2", 5)],
    ];
    let plan = plan(&checks, &two_nodes());
    let mut tally = Tally::new(&checks);
    for call in &group(&checks, plan.first) {
        tally.checked(
            call,
            answer(&checks, call, |k| {
                if k == "rl:ip:{x}1" {
                    None
                } else {
                    outcome(true)
                }
            }),
        );
    }
    assert_eq!(
        tally.refunds().len(),
        1,
        "the user's part gives its token back"
    );
    let out = tally.finish();
    assert_eq!(out[0], Err(FOREIGN_VALUE.into()));
    assert!(out[1].is_ok());
}

#[test]
fn shared_buckets_on_several_nodes_are_peeked_and_only_admitted_checks_take() {
    let checks = vec![
        vec![rule("rl:all{b}", 5), rule("rl:all{x}", 5)],
        vec![rule("rl:all{b}", 5), rule("rl:other{x}", 5)],
    ];
    let plan = plan(&checks, &two_nodes());
    assert!(plan.first.is_empty());
    assert_eq!(plan.peek, [true, true]);
    let mut tally = Tally::new(&checks);
    let peeks = group(&checks, plan.shared.clone());
    for call in &peeks {
        // rl:other would deny the second check.
        tally.peeked(
            call,
            answer(&checks, call, |k| outcome(!k.starts_with("rl:other"))),
        );
    }
    assert_eq!((tally.decided(0), tally.decided(1)), (false, true));
    let takes: Vec<_> = plan
        .shared
        .into_iter()
        .filter(|(_, p)| !tally.decided(p.check))
        .collect();
    assert!(takes.iter().all(|(_, p)| p.check == 0));
    for call in &group(&checks, takes) {
        tally.checked(call, answer(&checks, call, |_| outcome(true)));
    }
    assert!(tally.refunds().is_empty(), "the denied check took nothing");
    let out = tally.finish();
    assert!(out[0].as_ref().unwrap().1.iter().all(|r| r.allowed));
    assert!(!out[1].as_ref().unwrap().1[1].allowed);
}
