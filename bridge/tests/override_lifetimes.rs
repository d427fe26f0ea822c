//! How long an override may last, as an operator sets one: through `PUT /admin/overrides`
//! and through `ratelimit-bridge override set`, the same bound (a year) and the same words
//! beyond it. An override the bridge accepts is listed and applied (issue 38 row 8: a ttl of
//! `3650000d` was answered 200, then neither listed nor applied, its expiry written by the
//! script as `3.17e+14`).

use crate::common::process::BridgeProcess;
use crate::common::{Connect, Valkey};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use test_support::pki::Scratch;

const OPERATORS: &str = "operators-s3cret";
const YEAR_MS: u64 = 365 * 86_400_000;
/// One request a minute for alice, unless an override says otherwise.
const CHECK: &str = "rl:per-user:alice,1,1,60000,1\n";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn put(bridge: &BridgeProcess, ttl: &str) -> (u16, String) {
    let path = format!("/admin/overrides?rule=per-user&value=alice&requests=1000&per=1s&ttl={ttl}");
    bridge.request("PUT", &path, "", Some(OPERATORS))
}

/// The `expires` (Unix seconds) `GET /admin/overrides` lists for alice, if it lists her.
fn listed_expiry(bridge: &BridgeProcess) -> Option<u64> {
    let (status, body) = bridge.request("GET", "/admin/overrides", "", Some(OPERATORS));
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let alice = list
        .as_array()?
        .iter()
        .find(|o| o["key"] == "rl:per-user:alice")?;
    alice["expires"].as_u64()
}

/// How many of `n` checks of alice's bucket (1 a minute of her own) the bridge admits.
fn admitted(bridge: &BridgeProcess, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            let (status, reply) = bridge.check(CHECK);
            assert_eq!(status, 200, "{reply}");
            reply.contains(" 1,")
        })
        .count()
}

#[test]
fn an_override_lasts_at_most_a_year_and_one_accepted_is_listed_and_applied() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let operators = dir.write("operators", format!("{OPERATORS}\n"));
    let bridge = BridgeProcess::start(&[
        "--redis",
        &valkey.url(),
        "--admin-token-file",
        operators.to_str().unwrap(),
    ]);
    for beyond in [
        "366d",
        "3650000d",
        "31536000001ms",
        "18446744073709551615ms",
    ] {
        let (status, body) = put(&bridge, beyond);
        assert_eq!(status, 400, "{beyond}: {body}");
        assert!(body.contains("365d"), "{beyond}: {body}");
    }
    for bad in ["0s", "99999999999999999999d", "1y"] {
        let (status, body) = put(&bridge, bad);
        assert!(status == 400 && body.contains("ttl"), "{bad}: {body}");
    }
    assert_eq!(listed_expiry(&bridge), None, "nothing refused was written");

    // The edge itself: a year, listed with its expiry and applied by the next checks.
    let before = now_ms();
    let (status, body) = put(&bridge, "365d");
    assert_eq!(status, 200, "{body}");
    let expires = listed_expiry(&bridge).expect("the override is listed") * 1000;
    assert!(
        (before + YEAR_MS..=now_ms() + YEAR_MS + 1000).contains(&expires),
        "expires {expires}, a year after {before}"
    );
    // The bridges refresh their table every 250 ms: within a second, 1000 a second decides.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if admitted(&bridge, 5) == 5 {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the year-long override was not applied");
}

#[test]
fn the_command_line_refuses_the_same_lifetimes_in_the_same_words() {
    let valkey = Valkey::start();
    let set = |ttl: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_ratelimit-bridge"))
            .args(["override", "set", "--rule", "per-user", "--value", "alice"])
            .args(["--requests", "10", "--per", "1m", "--ttl", ttl])
            .args(["--redis", &valkey.url()])
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stderr) = set("3650000d");
    assert!(
        !ok && stderr.contains("ttl") && stderr.contains("365d"),
        "{stderr}"
    );
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(keys, 0, "nothing was written");
    let (ok, stderr) = set("365d");
    assert!(ok, "{stderr}");
}
