//! Passwords and ACL users on a single Valkey, end to end: the default user's password
//! (`requirepass`) and a least-privilege ACL user work from the URL and from
//! `--redis-username` / `--redis-password-file`; wrong credentials fail each check saying so
//! while the bridge keeps running and answering.

use crate::common::buckets::rule;
use crate::common::process::BridgeProcess;
use crate::common::{Valkey, BRIDGE_ACL};
use ratelimit_bridge::store::connection::connect::RedisAccess;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;
use test_support::pki::Scratch;

const ADMIN_PASSWORD: &str = "admin-pw";
const USER: &str = "ratelimit";
const PASSWORD: &str = "rl-pw";

/// A Valkey that wants a password, with the bridge's ACL user.
fn secured() -> Valkey {
    let valkey = Valkey::start_with(&["--requirepass", ADMIN_PASSWORD]);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(USER)
        .arg(BRIDGE_ACL)
        .arg(format!(">{PASSWORD}"))
        .query(&mut admin(&valkey))
        .unwrap();
    valkey
}

fn admin(valkey: &Valkey) -> redis::Connection {
    redis::Client::open(format!(
        "redis://:{ADMIN_PASSWORD}@127.0.0.1:{}",
        valkey.port
    ))
    .unwrap()
    .get_connection()
    .unwrap()
}

fn store(access: &RedisAccess, url: &str) -> Store {
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(5),
    };
    Store::with_client(access.single(url).unwrap(), options).unwrap()
}

async fn remaining(store: &Store, key: &str) -> Result<u64, String> {
    let (_, rules) = store.check(&vec![rule(key, 10, 1, 3_600_000, 1)]).await?;
    Ok(rules[0].remaining)
}

#[tokio::test]
async fn the_right_credentials_from_the_url_or_the_flags_work() {
    let valkey = secured();
    let files = Scratch::new();
    let port = valkey.port;
    let none = RedisAccess::default();
    let default_user = store(
        &none,
        &format!("redis://:{ADMIN_PASSWORD}@127.0.0.1:{port}"),
    );
    assert_eq!(remaining(&default_user, "rl:a").await, Ok(9));
    let acl_user = store(
        &none,
        &format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"),
    );
    assert_eq!(remaining(&acl_user, "rl:a").await, Ok(8));
    // Two fresh buckets of one limit: written together by MSETEX, which the ACL allows too.
    let (_, pair) = acl_user
        .check(&vec![
            rule("rl:b", 2, 1, 1000, 1),
            rule("rl:c", 2, 1, 1000, 1),
        ])
        .await
        .unwrap();
    assert!(
        pair.iter().all(|r| r.allowed && r.remaining == 1),
        "{pair:?}"
    );
    assert!(acl_user.ping().await);
    let flags = RedisAccess {
        username: Some(USER.into()),
        password_file: Some(files.write("password", format!("{PASSWORD}\n"))),
        ..RedisAccess::default()
    };
    let from_flags = store(&flags, &format!("redis://127.0.0.1:{port}"));
    assert_eq!(remaining(&from_flags, "rl:a").await, Ok(7));

    let anonymous = store(&none, &format!("redis://127.0.0.1:{port}"));
    let err = remaining(&anonymous, "rl:a").await.unwrap_err();
    // Valkey refuses a script call's arguments before AUTH: a protocol error, not NOAUTH.
    assert!(err.contains("unauthenticated"), "{err}");
    assert!(!anonymous.ping().await, "PING says NOAUTH");
    // The ACL holds the user to its keys: the bridge cannot be used to touch others.
    let outside = store(
        &none,
        &format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"),
    );
    let err = remaining(&outside, "other:key").await.unwrap_err();
    assert!(err.contains("NoPerm"), "{err}");
}

/// The bridge binary on `valkey` as the ACL user, its password in a file holding `password`.
fn bridge_as_user(valkey: &Valkey, files: &Scratch, password: &str) -> BridgeProcess {
    let password_file = files.write("password", password);
    let url = format!("redis://127.0.0.1:{}", valkey.port);
    BridgeProcess::start(&[
        "--redis",
        &url,
        "--redis-username",
        USER,
        "--redis-password-file",
        password_file.to_str().unwrap(),
    ])
}

#[test]
fn the_binary_authenticates_with_the_username_and_password_file_flags() {
    let valkey = secured();
    let files = Scratch::new();
    let bridge = bridge_as_user(&valkey, &files, &format!("  {PASSWORD}\n"));
    let (status, answer) = bridge.check("rl:bin,3,1,3600000,1\n");
    assert_eq!(
        (status, answer.split(' ').nth(1).map(|r| &r[..4])),
        (200, Some("1,2,")),
        "{answer}"
    );
    assert_eq!(bridge.health(), 200);
    assert!(!bridge.log().contains(PASSWORD));
}

#[test]
fn wrong_credentials_fail_checks_with_the_reason_and_the_bridge_keeps_running() {
    let valkey = secured();
    let files = Scratch::new();
    let wrong = "not-the-password";
    let mut bridge = bridge_as_user(&valkey, &files, wrong);
    for _ in 0..3 {
        let (status, answer) = bridge.check("rl:k,3,1,3600000,1\n");
        assert_eq!(status, 200);
        assert!(
            answer.starts_with("! redis: Password authentication failed"),
            "{answer}"
        );
        assert_eq!(bridge.health(), 503);
        assert!(bridge.running());
    }
    let log = bridge.log();
    assert!(
        log.contains("check failed: redis: Password authentication failed"),
        "{log}"
    );
    assert!(!log.contains(wrong), "{log}");
}

#[test]
fn once_redis_accepts_the_credentials_the_bridge_checks_again_without_a_restart() {
    let valkey = secured();
    let files = Scratch::new();
    let rotated = "the-new-password";
    let bridge = bridge_as_user(&valkey, &files, rotated);
    let (_, answer) = bridge.check("rl:k,3,1,3600000,1\n");
    assert!(
        answer.starts_with("! redis: Password authentication failed"),
        "{answer}"
    );
    // The operator gives the user the password the bridge was configured with (a rotation
    // done in the wrong order, fixed).
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(USER)
        .arg(format!(">{rotated}"))
        .query(&mut admin(&valkey))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let answer = loop {
        let (_, answer) = bridge.check("rl:k,3,1,3600000,1\n");
        if !answer.starts_with('!') || std::time::Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(answer.contains(" 1,2,"), "checks again: {answer}");
    assert_eq!(bridge.health(), 200);
}
