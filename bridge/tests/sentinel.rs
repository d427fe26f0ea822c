//! Redis Sentinel (`--sentinel`), with the binary as an operator runs it: a real Valkey
//! primary, its replicas and three real sentinels. The bridge finds the master through the
//! sentinels, follows a failover (the primary killed, or `SENTINEL FAILOVER`) to the
//! promoted replica, whose script cache is empty (`NOSCRIPT`), answers exactly there, and
//! says clearly when no sentinel answers or none knows the master's name. The commands
//! (`override`, `unblock`) connect the same way. Sentinels with a password of their own
//! and a master with another.

use crate::common::process::BridgeProcess;
use crate::common::sentinel::{Group, MASTER};
use crate::common::BRIDGE_ACL;
use std::process::Command;
use std::time::{Duration, Instant};
use test_support::free_port;
use test_support::pki::Scratch;

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");

/// The bridge on `group`'s sentinels, with `extra` flags.
fn bridge(group: &Group, extra: &[&str]) -> BridgeProcess {
    let urls = group.urls();
    let mut args = vec!["--sentinel", MASTER, "--redis", &urls];
    args.extend(extra);
    BridgeProcess::start(&args)
}

/// One check of `key`, 5 an hour: whether it was admitted, or why it failed.
fn take(bridge: &BridgeProcess, key: &str) -> Result<bool, String> {
    take_of(bridge, key, 5).map(|(admitted, _)| admitted)
}

/// One check of `key`, `limit` an hour: whether it was admitted and what remains, or why
/// it failed.
fn take_of(bridge: &BridgeProcess, key: &str, limit: u64) -> Result<(bool, u64), String> {
    let den = 3_600_000 / limit;
    let (status, answer) = bridge.check(&format!("{key},{limit},1,{den},1\n"));
    assert_eq!(status, 200, "{answer}");
    let rule = answer.split_once(' ').map(|(_, rule)| rule.trim_end());
    let fields: Vec<&str> = rule.map_or(Vec::new(), |r| r.split(',').collect());
    match fields[..] {
        [allowed @ ("1" | "0"), remaining, ..] => Ok((allowed == "1", remaining.parse().unwrap())),
        _ => Err(answer),
    }
}

/// How many script calls the data node on `port` ran since its stats were reset.
fn script_calls(group: &Group, port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut group.node(port))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// What `take` gives `n` times in a row.
fn takes(bridge: &BridgeProcess, key: &str, n: usize) -> Vec<bool> {
    (0..n).map(|_| take(bridge, key).unwrap()).collect()
}

fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "no {what} after {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ratelimit-bridge ARGS --sentinel ... --redis ...`: its output, which must be a success.
fn command(group: &Group, args: &[&str]) -> String {
    let output = Command::new(BINARY)
        .args(args)
        .args(["--sentinel", MASTER, "--redis", &group.urls()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_bridge_follows_a_failover_to_the_promoted_replica() {
    let mut group = Group::start(1, None, None);
    let (primary, replica) = (group.primary.port, group.replicas[0].port);
    let bridge = bridge(&group, &[]);
    wait_until("healthy bridge", Duration::from_secs(10), || {
        bridge.health() == 200
    });
    let five = [true, true, true, true, true, false];
    assert_eq!(takes(&bridge, "rl:before", 6), five);
    assert!(
        bridge
            .log()
            .contains(&format!("redis master \"{MASTER}\" is 127.0.0.1:{primary}")),
        "{}",
        bridge.log()
    );
    // The replica has the bucket (WAIT: replicated for sure), not the script: a
    // promoted replica answers the first EVALSHA with NOSCRIPT.
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut group.node(primary))
        .unwrap();
    assert_eq!(acked, 1);
    let sha = redis::Script::new(ratelimit_protocol::script::TOKEN_BUCKET_LUA)
        .get_hash()
        .to_string();
    let cached: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .query(&mut group.node(replica))
        .unwrap();
    assert_eq!(cached, [0], "the script is in the replica's cache already");

    let killed = Instant::now();
    group.primary.stop(); // SIGKILL
    let mut failed = 0;
    let served = loop {
        match take(&bridge, &format!("rl:during-{failed}")) {
            Ok(_) => break killed.elapsed(),
            Err(answer) => {
                assert!(answer.starts_with("! redis: "), "{answer}");
                failed += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "never served again"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("served again {served:?} after the primary was killed ({failed} checks failed)");
    assert!(served < Duration::from_secs(15), "{served:?}");
    assert_eq!(group.role(replica), "master");
    assert!(
        bridge.log().contains(&format!(
            "moved: now 127.0.0.1:{replica}, was 127.0.0.1:{primary}"
        )),
        "{}",
        bridge.log()
    );
    // Exact on the new master: a fresh bucket admits its 5, the replicated one nothing.
    assert_eq!(takes(&bridge, "rl:after", 6), five);
    assert_eq!(takes(&bridge, "rl:before", 2), [false, false]);
    assert_eq!(bridge.health(), 200);
    let (_, metrics) = bridge.request("GET", "/metrics", "", None);
    assert!(
        metrics.contains(&format!("node=\"127.0.0.1:{replica}\"")),
        "{metrics}"
    );

    // The operator's commands find the new master the same way.
    command(
        &group,
        &[
            "override",
            "set",
            "--rule",
            "per-user",
            "--value",
            "alice",
            "--requests",
            "10",
            "--per",
            "1m",
            "--ttl",
            "1h",
        ],
    );
    let listed = command(&group, &["override", "list"]);
    assert!(listed.contains("rl:per-user:alice"), "{listed}");
    let unblocked = command(&group, &["unblock", "--rule", "per-user", "--value", "bob"]);
    assert!(unblocked.contains("\"unblocked\":false"), "{unblocked}");
    let records: i64 = redis::cmd("EXISTS")
        .arg("rl:{overrides}")
        .query(&mut group.node(replica))
        .unwrap();
    assert_eq!(records, 1, "the override went to the new master");
}

/// `SENTINEL FAILOVER`: the old master stays up, and still a master, for seconds after the
/// sentinels switched to the replica (until they reconfigure it): the bridge moves when the
/// sentinels name the new master, not when the old one stops accepting writes.
#[test]
fn a_planned_failover_is_followed_while_the_old_master_still_accepts_writes() {
    let group = Group::start(1, None, None);
    let (primary, replica) = (group.primary.port, group.replicas[0].port);
    let bridge = bridge(&group, &[]);
    wait_until("healthy bridge", Duration::from_secs(10), || {
        bridge.health() == 200
    });
    // A bucket the checks drain across the failover.
    let limit = 1000;
    assert_eq!(
        take_of(&bridge, "rl:straddle", limit),
        Ok((true, limit - 1))
    );
    let mut admitted = 1;
    group.failover();
    let started = Instant::now();
    let mut failures = Vec::new();
    let moved = format!("moved: now 127.0.0.1:{replica}, was 127.0.0.1:{primary}");
    while !bridge.log().contains(&moved) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{}",
            bridge.log()
        );
        match take_of(&bridge, "rl:straddle", limit) {
            Ok((true, _)) => admitted += 1,
            Ok((false, _)) => panic!("denied before the limit"),
            Err(answer) => failures.push(answer),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let followed = started.elapsed();
    assert_eq!(
        group.role(primary),
        "master",
        "demoted already: the test shows nothing"
    );
    // From now on every call goes to the new master, none to the old one.
    for port in [primary, replica] {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut group.node(port))
            .unwrap();
    }
    let (_, remaining) = take_of(&bridge, "rl:straddle", limit).unwrap();
    admitted += 1;
    for n in 0..20 {
        assert_eq!(take(&bridge, &format!("rl:planned-{n}")), Ok(true));
    }
    assert_eq!(script_calls(&group, primary), 0);
    assert!(script_calls(&group, replica) >= 21);
    // What the new master lost of what the old one admitted after the promotion.
    let lost = admitted - (limit - remaining);
    println!(
        "planned failover: followed after {followed:?}; {} checks failed; {admitted} \
         admitted of the straddling bucket, {remaining} left of {limit} on the new master: \
         {lost} lost with the old master",
        failures.len()
    );
    for answer in &failures {
        assert!(answer.starts_with("! redis: "), "{answer}");
    }
    let five = [true, true, true, true, true, false];
    assert_eq!(takes(&bridge, "rl:after-planned", 6), five);
    assert_eq!(bridge.health(), 200);
}

#[test]
fn no_reachable_sentinel_or_an_unknown_master_name_says_so() {
    let group = Group::start(0, None, None);
    let urls = group.urls();
    let nowhere = format!(
        "redis://127.0.0.1:{},redis://127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let data_node = format!("redis://127.0.0.1:{}", group.primary.port);
    for (name, redis, expected) in [
        (
            "nope",
            urls.as_str(),
            "no sentinel knows a master named \"nope\"",
        ),
        (MASTER, nowhere.as_str(), "no sentinel answers"),
        (MASTER, data_node.as_str(), "not a sentinel"),
    ] {
        let bridge = BridgeProcess::start(&["--sentinel", name, "--redis", redis]);
        let answer = take(&bridge, "rl:x").unwrap_err();
        assert!(answer.starts_with("! redis: no master"), "{answer}");
        assert!(answer.contains(expected), "{answer}");
        assert_eq!(bridge.health(), 503);
        wait_until("the reason in the log", Duration::from_secs(5), || {
            bridge.log().contains(expected)
        });
        assert!(bridge.log().contains("redis does not answer (sentinel: "));
    }
    let (status, stderr) =
        BridgeProcess::run_to_exit(&["--cluster", "--sentinel", MASTER, "--redis", &urls]);
    assert!(!status.success());
    assert!(
        stderr.contains("--cluster and --sentinel exclude each other"),
        "{stderr}"
    );
    let (status, stderr) = BridgeProcess::run_to_exit(&["--sentinel-username", "u"]);
    assert!(!status.success());
    assert!(stderr.contains("need --sentinel"), "{stderr}");
}

#[test]
fn sentinels_and_the_master_may_each_have_their_own_password() {
    let (data, sentinel) = ("data-pw", "sentinel-pw");
    let group = Group::start(1, Some(data), Some(sentinel));
    let files = Scratch::new();
    let sentinel_file = files.write("sentinel-password", format!("{sentinel}\n"));
    let data_file = files.write("data-password", data);
    let in_urls = group
        .urls()
        .replace("redis://", &format!("redis://:{data}@"));
    // The master's password in the URLs or in its file; the sentinels' in theirs.
    for (i, (redis, flags)) in [
        (in_urls.as_str(), vec![]),
        (
            group.urls().as_str(),
            vec!["--redis-password-file", data_file.to_str().unwrap()],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut args = vec!["--sentinel", MASTER, "--redis", redis];
        args.extend(["--sentinel-password-file", sentinel_file.to_str().unwrap()]);
        args.extend(flags);
        let bridge = BridgeProcess::start(&args);
        wait_until("healthy bridge", Duration::from_secs(10), || {
            bridge.health() == 200
        });
        assert_eq!(take(&bridge, &format!("rl:auth-{i}")), Ok(true));
        let log = bridge.log();
        assert!(!log.contains(data) && !log.contains(sentinel), "{log}");
    }
    // Least-privilege users, as the guide writes them: the master's needs ROLE besides what
    // a single server's does, the sentinels' one subcommand.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("ratelimit")
        .arg(BRIDGE_ACL)
        .arg(&["+role", ">rl-pw"])
        .query(&mut group.node(group.primary.port))
        .unwrap();
    group.on_sentinels(redis::cmd("ACL").arg("SETUSER").arg("watcher").arg(&[
        "on",
        ">w-pw",
        "-@all",
        "+sentinel|get-master-addr-by-name",
    ]));
    let (user_file, watcher_file) = (files.write("rl", "rl-pw"), files.write("w", "w-pw"));
    let bridge = BridgeProcess::start(&[
        "--sentinel",
        MASTER,
        "--redis",
        &group.urls(),
        "--redis-username",
        "ratelimit",
        "--redis-password-file",
        user_file.to_str().unwrap(),
        "--sentinel-username",
        "watcher",
        "--sentinel-password-file",
        watcher_file.to_str().unwrap(),
    ]);
    wait_until("healthy bridge", Duration::from_secs(10), || {
        bridge.health() == 200
    });
    assert_eq!(take(&bridge, "rl:acl"), Ok(true));

    let bridge = BridgeProcess::start(&["--sentinel", MASTER, "--redis", &in_urls]);
    wait_until("the masked URL in the log", Duration::from_secs(5), || {
        bridge.log().contains("redis://:***@127.0.0.1:")
    });
    let answer = take(&bridge, "rl:x").unwrap_err();
    assert!(answer.contains("no sentinel answers"), "{answer}");
    let wrong = files.write("wrong", "not-it");
    let bridge = BridgeProcess::start(&[
        "--sentinel",
        MASTER,
        "--redis",
        &group.urls(),
        "--sentinel-password-file",
        sentinel_file.to_str().unwrap(),
        "--redis-password-file",
        wrong.to_str().unwrap(),
    ]);
    let answer = take(&bridge, "rl:x").unwrap_err();
    assert!(
        answer.contains("is a master") || answer.contains("no node"),
        "{answer}"
    );
    assert!(!bridge.log().contains("not-it"));
}
