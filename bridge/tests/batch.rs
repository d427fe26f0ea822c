//! Batches on a real Valkey: checks applied in order in one script call, each
//! all-or-nothing, large batches split, shared expiries written together, lease returns, and the
//! stored format of the previous script still read.

use crate::common::buckets::{
    batch, redis_now_ms, reset_stats, rule, run, script_calls, store, stored,
};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::store::check::Check;

#[tokio::test]
async fn buckets_written_together_each_expire_a_second_after_full() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // Fresh buckets of one limit share their time to full (written with one MSETEX where
    // the server has it); the others have their own.
    let same = |k: &str| vec![rule(k, 5, 1, 1000, 2)];
    let checks = [
        same("s1"),
        same("s2"),
        vec![rule("o", 5, 1, 1000, 1)],
        same("s3"),
    ];
    reset_stats(&valkey);
    let out = batch(&store, &checks).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut valkey.connection())
        .unwrap();
    let msetex: Vec<Option<Vec<redis::Value>>> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("MSETEX")
        .query(&mut valkey.connection())
        .unwrap();
    if msetex.first().is_some_and(Option::is_some) {
        assert!(info.contains("cmdstat_msetex:calls=1,"), "{info}");
        assert!(info.contains("cmdstat_set:calls=1,"), "{info}");
    }
    for ((_, o), key) in out.iter().zip(["s1", "s2", "o", "s3"]) {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query(&mut valkey.connection())
            .unwrap();
        let full = o[0].full_ms as i64;
        assert!(
            pttl > full && pttl <= full + 1_000,
            "{key}: pttl {pttl}, {o:?}"
        );
    }
    assert_eq!(
        out.iter().map(|(_, o)| o[0].full_ms).collect::<Vec<_>>(),
        [2_000, 2_000, 1_000, 2_000]
    );
}

#[tokio::test]
async fn a_batch_applies_its_checks_in_order_on_a_shared_key() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 3 tokens, one more per hour; five checks of one token in one batch.
    let r = rule("shared", 3, 1, 3_600_000, 1);
    run(&store, &[rule("warm-up", 1, 1, 1, 1)]).await; // loads the script
    reset_stats(&valkey);
    let out = batch(&store, &vec![vec![r]; 5]).await;
    let seen: Vec<(bool, u64)> = out
        .iter()
        .map(|(_, o)| (o[0].allowed, o[0].remaining))
        .collect();
    assert_eq!(
        seen,
        [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
    );
    assert!(
        out.iter().all(|(now, _)| *now == out[0].0),
        "one Redis time"
    );
    assert_eq!(stored(&valkey, "shared").unwrap().units, 0);
    assert_eq!(script_calls(&valkey), 1, "one script call for the batch");
}

#[tokio::test]
async fn a_check_denied_in_a_batch_takes_nothing_and_later_checks_see_its_tokens() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let roomy = rule("A", 10, 1, 3_600_000, 1);
    let tight = rule("B", 1, 1, 3_600_000, 1);
    let both = vec![roomy.clone(), tight.clone()];
    let out = batch(&store, &[both.clone(), both, vec![roomy]]).await;
    let seen: Vec<Vec<(bool, u64)>> = out
        .iter()
        .map(|(_, o)| o.iter().map(|r| (r.allowed, r.remaining)).collect())
        .collect();
    assert_eq!(
        seen,
        [
            vec![(true, 9), (true, 0)],
            // B denies; A alone would admit and is not charged.
            vec![(true, 9), (false, 0)],
            vec![(true, 8)],
        ]
    );
    assert_eq!(stored(&valkey, "A").unwrap().units, 8 * 3_600_000);
    assert_eq!(stored(&valkey, "B").unwrap().units, 0);
}

#[tokio::test]
async fn a_large_batch_is_split_into_bounded_calls_and_stays_in_order() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 1500 checks of two rules: 3000 keys, past one call's bound; all on one hot bucket
    // of 1000 tokens and one cold bucket each.
    let checks: Vec<Check> = (0..1500)
        .map(|i| {
            vec![
                rule("hot", 1000, 1, 3_600_000, 1),
                rule(&format!("cold{i}"), 5, 1, 3_600_000, 1),
            ]
        })
        .collect();
    reset_stats(&valkey);
    let out = batch(&store, &checks).await;
    assert!(
        script_calls(&valkey) >= 3,
        "{} calls",
        script_calls(&valkey)
    );
    let admitted: Vec<bool> = out.iter().map(|(_, o)| o[0].allowed).collect();
    assert_eq!(admitted.iter().filter(|&&a| a).count(), 1000);
    // Empty but for the few ms of refill between the calls.
    assert!(stored(&valkey, "hot").unwrap().units < 3_600_000);
    assert!(out.iter().all(|(_, o)| o[1].allowed && o[1].remaining >= 4));
}

#[tokio::test]
async fn a_lease_return_gives_each_cost_back_up_to_capacity() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = rule("r", 5, 1, 3_600_000, 2);
    assert_eq!(
        run(&store, std::slice::from_ref(&r)).await.1[0].remaining,
        3
    );
    // Two lease returns of one key in one batch: each returns its cost, up to capacity.
    let out: Vec<_> = store
        .return_leases(&[vec![r.clone()], vec![r]])
        .await
        .into_iter()
        .map(|o| o.unwrap().1.remove(0))
        .collect();
    assert_eq!((out[0].remaining, out[1].remaining), (5, 5), "{out:?}");
    assert!(out.iter().all(|o| o.allowed && o.full_ms == 0));
    // Full again: stored as full for the 1 ms it has left, or gone already.
    let left = stored(&valkey, "r");
    assert!(left.is_none_or(|b| b.units == 5 * 3_600_000), "{left:?}");
}

#[tokio::test]
async fn buckets_stored_as_text_by_the_previous_script_are_read() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let now = u128::from(redis_now_ms(&valkey));
    // 4 tokens left (of 10, one per second) one second ago: 5 now.
    let _: () = redis::cmd("SET")
        .arg("old")
        .arg(format!("{} {}", 4 * 1000, now - 1000))
        .query(&mut valkey.connection())
        .unwrap();
    let (_, out) = run(&store, &[rule("old", 10, 1, 1000, 1)]).await;
    assert!(out[0].allowed);
    assert!((4..=5).contains(&out[0].remaining), "{:?}", out[0]);
    assert!(
        stored(&valkey, "old").is_some(),
        "rewritten in the new format"
    );
}

#[tokio::test]
async fn a_check_without_rules_gets_the_redis_time() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let out = batch(&store, &[vec![], vec![rule("x", 1, 1, 1000, 1)]]).await;
    assert!(out[0].1.is_empty() && out[0].0 > 0);
    assert!(out[1].1[0].allowed);
}

#[tokio::test]
async fn values_the_script_did_not_write_are_never_overwritten() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let mut redis = valkey.connection();
    let _: () = redis::cmd("SET")
        .arg("text")
        .arg("alice's session")
        .query(&mut redis)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("digits")
        .arg("12 34 56")
        .query(&mut redis)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("hash")
        .arg("f")
        .arg("v")
        .query(&mut redis)
        .unwrap();
    // Our binary layout, but a level no bucket has.
    let nan: Vec<u8> = [&[1u8][..], &f64::NAN.to_le_bytes(), &0f64.to_le_bytes()].concat();
    let _: () = redis::cmd("SET")
        .arg("nan")
        .arg(nan)
        .query(&mut redis)
        .unwrap();
    let ok = || rule("ok", 5, 1, 1000, 1);
    let checks: Vec<Check> = vec![
        vec![rule("text", 5, 1, 1000, 1)],
        vec![rule("hash", 5, 1, 1000, 1)],
        vec![ok(), rule("digits", 5, 1, 1000, 1)],
        vec![rule("nan", 5, 1, 1000, 1)],
        vec![ok()],
    ];
    let out = store.check_all(&checks).await;
    for (i, o) in out.iter().enumerate().take(4) {
        let reason = o.as_ref().expect_err("a foreign value fails its check");
        assert!(reason.contains("did not write"), "check {i}: {reason}");
    }
    // The refused check took nothing from the bucket it shares with the next one.
    let admitted = out[4].as_ref().unwrap();
    assert_eq!(admitted.1[0].remaining, 4, "{admitted:?}");
    let text: String = redis::cmd("GET").arg("text").query(&mut redis).unwrap();
    let digits: String = redis::cmd("GET").arg("digits").query(&mut redis).unwrap();
    let kind: String = redis::cmd("TYPE").arg("hash").query(&mut redis).unwrap();
    assert_eq!(
        (text.as_str(), digits.as_str(), kind.as_str()),
        ("alice's session", "12 34 56", "hash")
    );
    for key in ["text", "digits", "hash"] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut redis).unwrap();
        assert_eq!(ttl, -1, "{key} got an expiry");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_exchanges_share_script_calls_and_stay_exact() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let _ = run(&store, &[rule("warm-up", 1, 1, 1, 1)]).await;
    reset_stats(&valkey);
    // 400 exchanges of one check each, all at once, on one hot bucket of 150 tokens and a
    // bucket of their own: the lane sends what queued behind the calls in flight together.
    let exchanges: Vec<_> = (0..400)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let check = vec![
                    rule("shared", 150, 1, 3_600_000, 1),
                    rule(&format!("own{i}"), 5, 1, 3_600_000, 1),
                ];
                store.check(&check).await.unwrap()
            })
        })
        .collect();
    let mut admitted = 0;
    for exchange in exchanges {
        let (_, rules) = exchange.await.unwrap();
        assert_eq!(rules.len(), 2);
        if rules[0].allowed {
            admitted += 1;
            assert_eq!(rules[1].remaining, 4, "its own bucket, charged once");
        } else {
            assert_eq!(rules[1].remaining, 5, "all or nothing");
        }
    }
    assert_eq!(admitted, 150, "exact across merged calls");
    let calls = script_calls(&valkey);
    assert!(calls <= 200, "{calls} script calls for 400 exchanges");
}

#[tokio::test]
async fn the_script_refuses_more_keys_than_one_call_may_carry_and_writes_nothing() {
    let valkey = Valkey::start();
    // One check of 1,025 one-rule parts, laid out by hand as a caller past the bound would.
    let keys: Vec<String> = (0..1025).map(|i| format!("over{i}")).collect();
    let script = redis::Script::new(ratelimit_protocol::script::TOKEN_BUCKET_LUA);
    let mut call = script.prepare_invoke();
    for key in &keys {
        call.key(key);
    }
    call.arg("check")
        .arg(1)
        .arg(&[10u64, 1, 1, 1, 0, 0, 0, 0, 0][..]);
    call.arg([1u8, 1].repeat(keys.len()));
    let err = call
        .invoke::<Vec<i64>>(&mut valkey.connection())
        .unwrap_err()
        .to_string();
    assert!(err.contains("1025 keys in one call, at most 1024"), "{err}");
    let written: i64 = redis::cmd("DBSIZE")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(written, 0);
}
