//! Bridges claiming what they hold of a global rule (`regions::agree`, `lua/claims.lua`) on
//! a real Valkey: a bridge whose claim differs from one already made refuses the rule at
//! its first round, the bridge already serving it refuses at its next, and both serve
//! again once the other's claim has lapsed; bridges that claim alike agree; a round that
//! did not reach every region grants nothing.

use crate::common::buckets::store;
use crate::common::Valkey;
use ratelimit_bridge::engine::regions::agree::{Agreement, Verdict};
use ratelimit_bridge::store::Store;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(2);

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| n.to_string()).collect()
}

/// Two regions kept by one Valkey: every claim is seen in both.
fn regions(valkey: &Valkey) -> Vec<(String, Store)> {
    let s = store(valkey);
    vec![("a".into(), s.clone()), ("b".into(), s)]
}

/// Whether `agreement` grants `key` of a rule homed in `home`, after its first round.
async fn grants(agreement: &Agreement, stores: &[(String, Store)], home: &str) -> bool {
    let (rule, mine) = agreement.claim_of("rl:tenant:t1", home);
    agreement.verdict(&rule, &mine);
    agreement.agreed(stores, &rule, &mine, WAIT).await
}

#[tokio::test]
async fn bridges_that_disagree_on_a_home_refuse_the_rule_until_one_is_gone() {
    let valkey = Valkey::start();
    let stores = regions(&valkey);
    let serving = Agreement::new("a", &names(&["a", "b"]));
    assert!(grants(&serving, &stores, "a").await, "alone: agreed");
    // A bridge whose gateway homes the rule in b: refused at once, never granted.
    let newcomer = Agreement::new("b", &names(&["a", "b"]));
    assert!(!grants(&newcomer, &stores, "b").await);
    let (rule, mine) = newcomer.claim_of("rl:tenant:t2", "b");
    assert_eq!(rule, "rl:tenant", "a rule's every key");
    assert!(
        matches!(newcomer.verdict(&rule, &mine), Verdict::Disagree(why)
        if why.contains("home=a regions=a,b") && why.contains("home=b regions=a,b"))
    );
    // The bridge already serving it refuses at its next round.
    let (rule, mine) = serving.claim_of("rl:tenant:t1", "a");
    let next = serving.round(&stores, &rule, &mine, WAIT).await;
    assert!(matches!(next, Verdict::Disagree(_)), "{next:?}");
    // The newcomer gone (it claims no more), its claim lapses within seconds.
    drop(newcomer);
    let mut verdict = next;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        verdict = serving.round(&stores, &rule, &mine, WAIT).await;
        if verdict == Verdict::Agreed {
            break;
        }
    }
    assert_eq!(verdict, Verdict::Agreed);
}

#[tokio::test]
async fn bridges_that_name_other_regions_disagree_and_alike_agree() {
    let valkey = Valkey::start();
    let stores = regions(&valkey);
    let a = Agreement::new("a", &names(&["a", "b", "c"]));
    let b = Agreement::new("b", &names(&["a", "b", "c"]));
    assert!(grants(&a, &stores, "").await);
    assert!(grants(&b, &stores, "").await, "claimed alike");
    let fewer = Agreement::new("c", &names(&["a", "c"]));
    assert!(!grants(&fewer, &stores, "").await, "a region fewer");
}

#[tokio::test]
async fn a_round_that_misses_a_region_grants_nothing() {
    let valkey = Valkey::start();
    let mut gone = Valkey::start();
    let mut stores = regions(&valkey);
    stores.push(("c".into(), store(&gone)));
    gone.stop();
    let agreement = Agreement::new("a", &names(&["a", "b", "c"]));
    assert!(!grants(&agreement, &stores, "a").await);
    let (rule, mine) = agreement.claim_of("rl:tenant:t1", "a");
    assert_eq!(agreement.verdict(&rule, &mine), Verdict::Unknown);
}
