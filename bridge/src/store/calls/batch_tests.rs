use super::*;
use crate::store::calls::commit::MAX_KEYS_PER_CALL;
use crate::store::fakes::{rule, two_nodes};

/// Each part as (check, its rules).
type Parts = Vec<(usize, Vec<usize>)>;

/// Each call as (node, its parts).
fn shape_of(calls: &[Call]) -> Vec<(usize, Parts)> {
    calls
        .iter()
        .map(|c| {
            (
                c.node,
                c.parts.iter().map(|p| (p.check, p.rules.clone())).collect(),
            )
        })
        .collect()
}

#[test]
fn a_single_server_gets_the_whole_batch_in_one_call() {
    let checks = vec![vec![rule("a", 1), rule("b", 1)], vec![], vec![rule("a", 1)]];
    let plan = plan(&checks, &Topology::single());
    assert!(plan.shared.is_empty() && !plan.spanning.contains(&true));
    let calls = group(&checks, plan.first);
    assert_eq!(
        shape_of(&calls),
        [(0, vec![(0, vec![0, 1]), (1, vec![]), (2, vec![0])])]
    );
}

#[test]
fn large_batches_are_cut_between_checks() {
    let checks: Vec<Check> = (0..MAX_KEYS_PER_CALL)
        .map(|i| vec![rule(&format!("{i}a"), 1), rule(&format!("{i}b"), 1)])
        .collect();
    let calls = group(&checks, plan(&checks, &Topology::single()).first);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c.rules() == MAX_KEYS_PER_CALL));
    assert_eq!(calls[1].parts[0].check, MAX_KEYS_PER_CALL / 2);
}

#[test]
fn a_call_names_at_most_255_shapes_and_an_oversized_check_goes_alone() {
    let shaped = |i: u64| RuleSpec {
        burst: 1 + i,
        ..rule(&format!("s{i}"), 1)
    };
    let mut checks: Vec<Check> = (0..300).map(|i| vec![shaped(i)]).collect();
    checks.push((0..300).map(|i| rule(&format!("big{i}"), 1)).collect());
    checks.push(vec![rule("after", 1)]);
    let calls = group(&checks, plan(&checks, &Topology::single()).first);
    let sizes: Vec<usize> = calls.iter().map(|c| c.parts.len()).collect();
    assert_eq!(sizes, [255, 45, 1, 1]);
    assert_eq!(calls[2].parts[0].check, 300);
}

#[test]
fn a_cluster_gets_one_call_per_node_whatever_the_slots() {
    // {b} and {c} are different slots of node A; {x} is on node B.
    let checks = vec![
        vec![rule("rl:u:{b}1", 1), rule("rl:ip:{c}1", 1)],
        vec![rule("rl:u:{x}2", 1)],
        vec![rule("rl:u:{c}3", 1), rule("rl:u:{b}4", 1)],
    ];
    let plan = plan(&checks, &two_nodes());
    assert_eq!(plan.spanning, [false, false, false]);
    let calls = group(&checks, plan.first);
    assert_eq!(
        shape_of(&calls),
        [
            (0, vec![(0, vec![0, 1]), (2, vec![0, 1])]),
            (1, vec![(1, vec![0])])
        ]
    );
}

#[test]
fn a_check_spanning_nodes_takes_its_own_buckets_first_and_shared_ones_after() {
    let checks = vec![
        // Own on A and B, shared on A.
        vec![
            rule("rl:per-user:{b}alice", 1),
            rule("rl:global{c}", 1),
            rule("rl:per-ip:{x}1", 1),
        ],
        // Shared only, on both nodes.
        vec![rule("rl:all{b}", 1), rule("rl:all{x}", 1)],
    ];
    let plan = plan(&checks, &two_nodes());
    assert_eq!(plan.spanning, [true, true]);
    assert_eq!(plan.peek, [false, true], "shared on two nodes: peeked");
    let first: Vec<(usize, usize, Vec<usize>)> = plan
        .first
        .iter()
        .map(|(n, p)| (*n, p.check, p.rules.clone()))
        .collect();
    assert_eq!(first, [(0, 0, vec![0]), (1, 0, vec![2])]);
    let shared: Vec<(usize, usize, Vec<usize>)> = plan
        .shared
        .iter()
        .map(|(n, p)| (*n, p.check, p.rules.clone()))
        .collect();
    assert_eq!(shared, [(0, 0, vec![1]), (0, 1, vec![0]), (1, 1, vec![1])]);
}

#[test]
fn shared_buckets_name_no_client() {
    assert!(is_shared("rl:global"));
    assert!(is_shared("edge:search-all"));
    assert!(!is_shared("rl:per-user:alice"));
    assert!(!is_shared("rl:per-ip:::1"), "an IPv6 address holds colons");
    assert!(!is_shared("rl:four:#0123"));
}

#[test]
fn only_checks_spanning_nodes_lose_their_leases() {
    let leased = |key: &str| RuleSpec {
        lease: 5,
        ..rule(key, 1)
    };
    let checks = vec![vec![leased("a")], vec![leased("b"), leased("c")]];
    let out = without_leases(&checks, &[false, true]);
    assert_eq!(out[0][0].lease, 5);
    assert!(out[1].iter().all(|r| r.lease == 0));
}
