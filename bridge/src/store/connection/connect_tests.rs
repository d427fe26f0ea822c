#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn redact_hides_passwords_only() {
    for (url, logged) in [
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
        ("redis://alice@h:1/0", "redis://alice@h:1/0"),
        ("rediss://alice:s3cr%40t@h:1", "rediss://alice:***@h:1"),
        ("redis://:pw@h:1", "redis://:***@h:1"),
        ("redis://u:p@ss/w@rd@h:1/2", "redis://u:***@h:1/2"),
        (
            "redis://a:x@h1:1,redis://h2:2,redis://a:y@h3:3",
            "redis://a:***@h1:1,redis://h2:2,redis://a:***@h3:3",
        ),
        ("not a url", "not a url"),
    ] {
        assert_eq!(redact(url), logged, "{url}");
    }
}

fn password_file(name: &str, text: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("ratelimit-connect-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn flags_set_the_credentials() {
    let path = password_file("flags", "  s3cret\n");
    let access = RedisAccess {
        username: Some("alice".into()),
        password_file: Some(path.clone()),
        ..RedisAccess::default()
    };
    let password = access.password();
    std::fs::remove_file(path).unwrap();
    let password = password.unwrap();
    assert_eq!(password.as_deref(), Some("s3cret"), "trimmed");
    let info = access
        .authenticated(parse("redis://h:1").unwrap(), password.as_deref())
        .unwrap();
    assert_eq!(info.redis_settings().username(), Some("alice"));
    assert_eq!(info.redis_settings().password(), Some("s3cret"));
}

#[test]
fn conflicting_or_incomplete_credentials_are_refused_naming_the_flag() {
    let empty = password_file("empty", " \n");
    let given = password_file("given", "pw");
    let cases = [
        (
            Some("bob"),
            None,
            "redis://alice:pw@h:1",
            "--redis-username",
        ),
        (
            None,
            Some(given.clone()),
            "redis://:pw@h:1",
            "--redis-password-file",
        ),
        (Some("bob"), None, "redis://h:1", "needs a password"),
        (None, None, "redis://alice@h:1", "needs a password"),
        (None, Some(empty.clone()), "redis://h:1", "is empty"),
        (
            None,
            Some("/nonexistent/pw".into()),
            "redis://h:1",
            "/nonexistent/pw",
        ),
    ];
    for (username, password_file, url, expected) in cases {
        let access = RedisAccess {
            username: username.map(String::from),
            password_file,
            ..RedisAccess::default()
        };
        let err = access.single(url).err().unwrap();
        assert!(err.contains(expected), "{url}: {err}");
        assert!(!err.contains(":pw@"), "{err}");
    }
    std::fs::remove_file(empty).unwrap();
    std::fs::remove_file(given).unwrap();
}

#[test]
fn sentinels_get_their_own_login_and_the_master_the_urls_and_tls() {
    let path = password_file("sentinel", "s-pw\n");
    let login = SentinelLogin {
        username: Some("watcher".into()),
        password_file: Some(path.clone()),
    };
    let urls = [
        "rediss://:m-pw@s1:26379/2".to_string(),
        "rediss://:m-pw@s2:26379/2".into(),
    ];
    let clients = RedisAccess::default().sentinel(&urls, &login);
    std::fs::remove_file(path).unwrap();
    let clients = clients.unwrap();
    assert_eq!(clients.sentinels.len(), 2);
    let (name, sentinel) = &clients.sentinels[0];
    assert_eq!(name, "s1:26379");
    let info = sentinel.get_connection_info();
    assert!(matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
    let settings = info.redis_settings();
    assert_eq!(
        (settings.username(), settings.password(), settings.db()),
        (Some("watcher"), Some("s-pw"), 0)
    );
    let master = clients.master.client("10.0.0.9", 6380).unwrap();
    let info = master.get_connection_info();
    assert!(
        matches!(info.addr(), ConnectionAddr::TcpTls { host, port: 6380, .. } if host == "10.0.0.9")
    );
    let settings = info.redis_settings();
    assert_eq!((settings.password(), settings.db()), (Some("m-pw"), 2));
    let plain = RedisAccess::default()
        .sentinel(&["redis://s1:26379".to_string()], &SentinelLogin::default())
        .unwrap();
    let info = plain
        .master
        .client("h", 1)
        .unwrap()
        .get_connection_info()
        .clone();
    assert!(matches!(info.addr(), ConnectionAddr::Tcp(..)));
    assert_eq!(info.redis_settings().password(), None);
}

#[test]
fn sentinel_urls_must_agree() {
    let none = SentinelLogin::default();
    for (urls, login, expected) in [
        (
            vec!["redis://:a@s1:1", "redis://:b@s2:1"],
            none.clone(),
            "the same user, password and database",
        ),
        (
            vec!["rediss://s1:1", "redis://s2:1"],
            none.clone(),
            "some URLs are rediss://",
        ),
        (
            vec!["redis://s1:1"],
            SentinelLogin {
                username: Some("u".into()),
                password_file: None,
            },
            "--sentinel-username needs --sentinel-password-file",
        ),
        (
            vec!["redis://s1:1"],
            SentinelLogin {
                username: None,
                password_file: Some("/nonexistent/spw".into()),
            },
            "--sentinel-password-file /nonexistent/spw",
        ),
    ] {
        let urls: Vec<String> = urls.into_iter().map(String::from).collect();
        let err = RedisAccess::default()
            .sentinel(&urls, &login)
            .err()
            .unwrap();
        assert!(err.contains(expected), "{urls:?}: {err}");
    }
}

#[test]
fn tls_files_need_rediss_urls() {
    let access = RedisAccess {
        tls: TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        },
        ..RedisAccess::default()
    };
    let err = access.single("redis://h:1").err().unwrap();
    assert!(err.contains("need a rediss:// URL"), "{err}");
    let seeds = ["rediss://h:1".to_string(), "redis://h:2".to_string()];
    let err = access.cluster(&seeds).err().unwrap();
    assert!(err.contains("some URLs are rediss://"), "{err}");
    let err = access.single("rediss://h:1").err().unwrap();
    assert!(
        err.contains("--redis-ca-file /nonexistent/ca.pem: "),
        "{err}"
    );
}
