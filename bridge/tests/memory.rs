//! A Redis with `maxmemory`, flooded with fresh clients' keys (each new `x-user-id` makes
//! one). Under `volatile-ttl`, the policy docs/operations.md asks for, Redis evicts the buckets
//! closest to being full again (every bucket has a TTL: the time until it is full), so the
//! flood never makes a check fail, a hot client's count stays exact, and the overrides
//! (which have no TTL) are never evicted. Under `noeviction` every check fails once memory
//! is full, old clients' and new ones' alike, and the failure says `OOM`; the bridge warns
//! about that configuration when it starts.

use crate::common::buckets::{rule, store};
use crate::common::cluster::OneNodeCluster;
use crate::common::process::BridgeProcess;
use crate::common::{Connect, Valkey};
use ratelimit_bridge::engine::overrides::registry;
use ratelimit_bridge::engine::overrides::{parse_spec, Target};
use ratelimit_bridge::store::check::{Check, RuleSpec};
use ratelimit_bridge::store::Store;
use std::time::{Duration, Instant};

const MAXMEMORY: &str = "4mb";
/// Checks per script call, as a busy bridge sends them.
const BATCH: usize = 256;
/// Fresh clients: about three times what 4 MB holds (some 100 bytes a key, see docs/operations.md).
const FLOOD: usize = 400 * BATCH;
/// The hot client's burst, which the flood must not change by one token.
const HOT_BURST: u64 = 100;

fn valkey(policy: &str) -> Valkey {
    Valkey::start_with(&["--maxmemory", MAXMEMORY, "--maxmemory-policy", policy])
}

/// 10 an hour: a flooding client's bucket, one token short, lives 6 minutes (until full).
fn fresh(i: usize) -> RuleSpec {
    rule(&format!("rl:per-user:flood-{i:06}"), 10, 1, 360_000, 1)
}

/// One token an hour: after a few checks the hot bucket's TTL is hours, longer than any
/// flooding client's, so `volatile-ttl` never picks it.
fn hot() -> RuleSpec {
    rule("rl:per-user:hot", HOT_BURST, 1, 3_600_000, 1)
}

fn info(valkey: &Valkey, field: &str) -> u64 {
    let text: String = redis::cmd("INFO").query(&mut valkey.connection()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO"))
        .trim()
        .parse()
        .unwrap()
}

/// Sends the flood in batches, each with one check of the hot client; how many of the hot
/// client's checks were admitted, and every failure's reason.
async fn flood(store: &Store) -> (u64, Vec<String>) {
    let (mut hot_admitted, mut failures) = (0, Vec::new());
    for start in (0..FLOOD).step_by(BATCH) {
        let mut checks: Vec<Check> = (start..start + BATCH - 1).map(|i| vec![fresh(i)]).collect();
        checks.push(vec![hot()]);
        for (i, outcome) in store.check_all(&checks).await.into_iter().enumerate() {
            match outcome {
                Ok((_, rules)) if i == BATCH - 1 => hot_admitted += u64::from(rules[0].allowed),
                Ok((_, rules)) => assert!(rules[0].allowed, "a fresh client was denied"),
                Err(why) => failures.push(why),
            }
        }
    }
    (hot_admitted, failures)
}

#[tokio::test]
async fn under_volatile_ttl_a_flood_of_fresh_keys_fails_no_check_and_evicts_no_override() {
    let valkey = valkey("volatile-ttl");
    let store = store(&valkey);
    // An emergency override, set before the flood, shorter-lived than any bucket of it.
    let target = Target::new("rl", "per-user", &["mallory".into()]).unwrap();
    let (limit, ttl_ms) = parse_spec(1, "1m", None, "1m").unwrap();
    registry::set(&store, target, limit, ttl_ms).await.unwrap();

    let (hot_admitted, failures) = flood(&store).await;
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "checks failed under the flood"
    );
    // Memory was full: most of the flood was evicted, not stored.
    let evicted = info(&valkey, "evicted_keys");
    assert!(
        evicted > FLOOD as u64 / 2,
        "{evicted} evicted: the flood did not fill 4 MB"
    );
    // Exactly the burst, as without the flood: the hot bucket was never evicted.
    assert!(
        (FLOOD / BATCH) as u64 > HOT_BURST,
        "the hot client asks for more than its burst"
    );
    assert_eq!(hot_admitted, HOT_BURST, "{evicted} keys evicted");
    // The override's record and its index have no TTL, so volatile-ttl leaves them be.
    let active = registry::list(&store, "rl").await.unwrap();
    assert_eq!(active.len(), 1, "the override was evicted");
    assert_eq!(active[0].target.key, "rl:per-user:mallory");
}

#[tokio::test]
async fn under_noeviction_a_full_redis_fails_every_check_saying_oom() {
    let valkey = valkey("noeviction");
    let store = store(&valkey);
    let (_, failures) = flood(&store).await;
    assert!(!failures.is_empty(), "4 MB held the whole flood");
    assert!(failures.iter().all(|f| f.contains("OOM")), "{failures:?}");
    // Not only new clients: the hot one, whose key exists, fails as well. Memory hovers
    // at the limit, so a batch that comes as a buffer is freed may pass (CI saw one batch
    // of 400 do so): nearly every check fails, not every one.
    let (hot_admitted, failures) = flood(&store).await;
    let batches = FLOOD / BATCH;
    assert!(
        failures.len() >= FLOOD - batches / 10 * BATCH,
        "{} of {FLOOD} checks failed once memory was full",
        failures.len()
    );
    assert!(
        hot_admitted <= (batches / 10) as u64,
        "the hot client passed {hot_admitted} times"
    );
    let metrics = store.metrics().render().unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("ratelimit_bridge_script_call_failures_total{")
                && l.contains("kind=\"oom\"")
        ),
        "{metrics}"
    );
}

/// The bridge's warnings about `maxmemory`, once it has answered healthy a moment.
fn memory_warnings(args: &[&str]) -> (Vec<String>, String) {
    let bridge = BridgeProcess::start(args);
    let deadline = Instant::now() + Duration::from_secs(10);
    while bridge.health() != 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The policy is read once Redis first answers, right after the first ping.
    std::thread::sleep(Duration::from_millis(300));
    let log = bridge.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("maxmemory"))
        .map(str::to_string)
        .collect();
    (warnings, log)
}

#[test]
fn the_bridge_warns_at_start_about_a_policy_that_fails_or_evicts_overrides() {
    for (policy, warned) in [
        ("noeviction", Some("every check fails")),
        ("allkeys-lru", Some("may evict the overrides")),
        ("volatile-ttl", None),
    ] {
        let valkey = valkey(policy);
        let (warnings, log) = memory_warnings(&["--redis", &valkey.url()]);
        match warned {
            Some(why) => {
                assert_eq!(warnings.len(), 1, "{policy}: {log}");
                assert!(
                    warnings[0].contains(policy) && warnings[0].contains(why),
                    "{log}"
                );
                assert!(warnings[0].contains("volatile-ttl"), "names the fix: {log}");
            }
            None => assert!(warnings.is_empty(), "{policy}: {log}"),
        }
    }
}

#[test]
fn on_a_cluster_the_policy_is_read_from_a_primary() {
    let node = OneNodeCluster::start();
    for (name, value) in [("maxmemory", "64mb"), ("maxmemory-policy", "noeviction")] {
        let _: () = node.cmd(redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
    }
    let (warnings, log) = memory_warnings(&["--cluster", "--redis", &node.url()]);
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("maxmemory 67108864 bytes"), "{log}");
}
