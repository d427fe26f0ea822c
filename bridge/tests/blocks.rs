//! Automatic blocks in the token bucket script on a real Valkey: a client denied `after`
//! times within `within` is blocked for `for`, taking nothing, in the same call that
//! denies; the block outlives a refill and ends on time; a count past its window starts
//! again; an operator's `unblock` lifts a block at once, keeping the level; `usage` shows a
//! block in force, and reading it moves neither the block nor anything else.

use crate::common::buckets::{redis_now_ms, rule, run, store};
use crate::common::{Connect, Valkey};
use ratelimit_bridge::doors::usage;
use ratelimit_bridge::engine::overrides::Target;
use ratelimit_bridge::engine::unblock::unblock;
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::store::check::RuleSpec;
use ratelimit_protocol::Block;
use std::time::Duration;

fn blocking(key: &str, burst: u64, den: u64, after: u64, within_ms: u64, for_ms: u64) -> RuleSpec {
    RuleSpec {
        block: Some(Block {
            after,
            within_ms,
            for_ms,
        }),
        ..rule(key, burst, 1, den, 1)
    }
}

#[tokio::test]
async fn the_nth_denial_blocks_and_a_blocked_client_takes_nothing_until_the_block_ends() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 1 token an hour; blocked for 1.5 s after 3 denials within a minute.
    let login = blocking("rl:login:ip", 1, 3_600_000, 3, 60_000, 1_500);
    let roomy = rule("rl:per-user:u", 100, 1, 1, 1);
    assert!(run(&store, std::slice::from_ref(&login)).await.1[0].allowed);
    for _ in 0..2 {
        let out = run(&store, std::slice::from_ref(&login)).await.1;
        assert!(!out[0].allowed && !out[0].blocked, "{out:?}");
    }
    let out = run(&store, std::slice::from_ref(&login)).await.1;
    assert!(
        out[0].blocked && !out[0].allowed,
        "third denial blocks: {out:?}"
    );
    assert!(out[0].wait_ms > 1_000 && out[0].wait_ms <= 1_500, "{out:?}");
    assert_eq!(out[0].remaining, 0);

    // Blocked, a check with another rule takes nothing from it either.
    let (_, out) = run(&store, &[roomy.clone(), login.clone()]).await;
    assert!(out[1].blocked && out[0].remaining == 100, "{out:?}");
    assert_eq!(
        run(&store, std::slice::from_ref(&roomy)).await.1[0].remaining,
        99
    );

    // The key lives at least as long as the block.
    let ttl: i64 = redis::cmd("PTTL")
        .arg("rl:login:ip")
        .query(&mut valkey.connection())
        .unwrap();
    assert!(ttl > 1_000, "{ttl}");

    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let out = run(&store, std::slice::from_ref(&login)).await.1;
    assert!(
        !out[0].blocked && !out[0].allowed,
        "over, but still no token: {out:?}"
    );
}

#[tokio::test]
async fn denials_count_within_their_window_only() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = blocking("rl:r:k", 1, 3_600_000, 2, 200, 60_000);
    assert!(run(&store, std::slice::from_ref(&r)).await.1[0].allowed);
    assert!(!run(&store, std::slice::from_ref(&r)).await.1[0].blocked);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The first denial's window is over: this one starts a new count.
    assert!(!run(&store, std::slice::from_ref(&r)).await.1[0].blocked);
    assert!(
        run(&store, std::slice::from_ref(&r)).await.1[0].blocked,
        "two within 200 ms"
    );
}

#[tokio::test]
async fn a_rule_without_a_block_never_blocks_and_keeps_the_short_format() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let r = rule("rl:r:plain", 1, 1, 3_600_000, 1);
    for _ in 0..20 {
        assert!(!run(&store, std::slice::from_ref(&r)).await.1[0].blocked);
    }
    assert!(
        crate::common::buckets::stored(&valkey, "rl:r:plain").is_some(),
        "no block state: tag 3"
    );
}

#[tokio::test]
async fn unblock_lifts_a_block_at_once_and_keeps_the_level() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 2 an hour; blocked for an hour after 2 denials.
    let login = blocking("rl:login:victim", 2, 1_800_000, 2, 60_000, 3_600_000);
    let outcomes: Vec<(bool, bool)> = {
        let mut all = Vec::new();
        for _ in 0..5 {
            let out = run(&store, std::slice::from_ref(&login)).await.1;
            all.push((out[0].allowed, out[0].blocked));
        }
        all
    };
    assert_eq!(
        outcomes,
        [
            (true, false),
            (true, false),
            (false, false),
            (false, true),
            (false, true)
        ]
    );
    let target = Target::new("rl", "login", &["victim".into()]).unwrap();
    assert!(unblock(&store, &target).await.unwrap(), "it was blocked");
    // No longer blocked, and no token made up: the spoofer's 2 are still spent.
    let out = run(&store, std::slice::from_ref(&login)).await.1;
    assert!(!out[0].blocked && !out[0].allowed, "{out:?}");
    assert!(out[0].wait_ms > 1_700_000, "{out:?}");
    // The count of denials started again: the one above is the first.
    let out = run(&store, std::slice::from_ref(&login)).await.1;
    assert!(out[0].blocked, "the second denial blocks again: {out:?}");
    assert!(unblock(&store, &target).await.unwrap());
    assert!(
        !unblock(&store, &target).await.unwrap(),
        "nothing left to lift"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg("rl:login:victim")
        .query(&mut valkey.connection())
        .unwrap();
    assert!(ttl > 3_000_000, "the key keeps its TTL: {ttl}");
}

#[tokio::test]
async fn usage_shows_a_block_in_force_and_reading_it_moves_nothing() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    // 2 an hour; blocked for a minute after 2 denials: 2 admitted, 1 denied, then blocked.
    let login = blocking("rl:login:eve", 2, 1_800_000, 2, 60_000, 60_000);
    for _ in 0..4 {
        run(&store, std::slice::from_ref(&login)).await;
    }
    let now_s = redis_now_ms(&valkey) / 1000;
    let dump = || -> Vec<u8> {
        redis::cmd("DUMP")
            .arg("rl:login:eve")
            .query(&mut valkey.connection())
            .unwrap()
    };
    let before = dump();
    let looking = RuleSpec {
        cost: 0,
        ..login.clone()
    };
    let engine = Engine::new(store.clone(), None);
    let usage = usage::read(&engine, "rl", "login", looking.clone())
        .await
        .unwrap();
    assert_eq!(usage["remaining"], 0, "{usage}");
    assert_eq!(usage["owed"], 0, "{usage}");
    let until = usage["blocked"]["until"].as_u64().unwrap();
    assert!((now_s + 59..=now_s + 61).contains(&until), "{usage}");
    // Looked at again and again: the block ends when it did, and nothing was written.
    for _ in 0..5 {
        let again = usage::read(&engine, "rl", "login", looking.clone())
            .await
            .unwrap();
        assert_eq!(again["blocked"], usage["blocked"], "{again}");
    }
    assert_eq!(dump(), before);
}

#[tokio::test]
async fn unblock_leaves_buckets_without_a_block_and_foreign_values_alone() {
    let valkey = Valkey::start();
    let store = store(&valkey);
    let plain = rule("rl:r:plain", 5, 1, 1_000, 1);
    run(&store, std::slice::from_ref(&plain)).await;
    let mut conn = crate::common::Connect::connection(&valkey);
    let before: Vec<u8> = redis::cmd("GET")
        .arg("rl:r:plain")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("rl:r:alien")
        .arg("not ours")
        .query(&mut conn)
        .unwrap();
    for (value, key) in [
        ("plain", "rl:r:plain"),
        ("alien", "rl:r:alien"),
        ("none", "rl:r:none"),
    ] {
        let target = Target::new("rl", "r", &[value.into()]).unwrap();
        assert_eq!(target.key, key);
        assert!(!unblock(&store, &target).await.unwrap(), "{key}");
    }
    let after: Vec<u8> = redis::cmd("GET")
        .arg("rl:r:plain")
        .query(&mut conn)
        .unwrap();
    assert_eq!(before, after);
    let alien: String = redis::cmd("GET")
        .arg("rl:r:alien")
        .query(&mut conn)
        .unwrap();
    assert_eq!(alien, "not ours");
    let none: i64 = redis::cmd("EXISTS")
        .arg("rl:r:none")
        .query(&mut conn)
        .unwrap();
    assert_eq!(none, 0, "unblocking writes no bucket");
}
