//! Who may use `/admin/`: only holders of the operators' secret (`--admin-token-file`), never
//! the gateways' token, which every gateway holds and Envoy shows in its `/config_dump`
//! (anyone with one gateway's admin port would change every client's limits). A bridge
//! without an admin token file serves no admin endpoint; the admin token checks nothing.
//! The binary as an operator runs it, so that its flags are held to this too.

use crate::common::process::BridgeProcess;
use crate::common::{Connect, Valkey};
use test_support::pki::Scratch;

const GATEWAYS: &str = "gateways-s3cret";
const OPERATORS: &str = "operators-s3cret";

/// Every admin endpoint, and paths under /admin/ that are none (refused alike without the
/// secret: a caller learns nothing of what exists).
const ADMIN_CALLS: &[(&str, &str)] = &[
    ("GET", "/admin/overrides"),
    (
        "PUT",
        "/admin/overrides?rule=per-user&value=mallory&requests=1000&per=1s&ttl=1h",
    ),
    ("DELETE", "/admin/overrides?rule=per-user&value=alice"),
    ("GET", "/admin/usage?rule=per-user&value=alice"),
    ("DELETE", "/admin/blocks?rule=per-user&value=alice"),
    ("POST", "/admin/overrides"),
    ("GET", "/admin/anything"),
];

const PLUGIN: &str = r#"{"backend": {"cluster": "bridge"},
    "identity": {"user": {"header": "x-user-id"}},
    "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 3, "per": "1m"}}]}"#;

const CHECK: &str = "rl:per-user:alice,3,1,20000,1\n";

fn keys(valkey: &Valkey) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut valkey.connection())
        .unwrap()
}

/// The bridge on `valkey` with `flags`, the token files and the plugin written in `dir`.
fn bridge(valkey: &Valkey, dir: &Scratch, flags: &[&str]) -> BridgeProcess {
    let gateways = dir.write("gateways", format!("{GATEWAYS}\n"));
    let operators = dir.write("operators", format!("{OPERATORS}\n"));
    let plugin = dir.write("plugin.json", PLUGIN);
    let mut args = vec!["--redis".to_string(), valkey.url()];
    for flag in flags {
        args.push(flag.to_string());
        args.push(
            match *flag {
                "--token-file" => &gateways,
                "--admin-token-file" => &operators,
                "--config" => &plugin,
                other => panic!("no file for {other}"),
            }
            .display()
            .to_string(),
        );
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    BridgeProcess::start(&args)
}

#[test]
fn a_bridge_without_an_admin_token_file_serves_no_admin_endpoint() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let bridge = bridge(&valkey, &dir, &["--token-file", "--config"]);
    for &(method, path) in ADMIN_CALLS {
        for token in [Some(GATEWAYS), None, Some(OPERATORS)] {
            let (status, body) = bridge.request(method, path, "", token);
            assert_eq!(status, 404, "{method} {path} as {token:?}: {body}");
        }
    }
    assert_eq!(keys(&valkey), 0, "refused calls touched nothing");
    // The gateways are served as before.
    assert_eq!(
        bridge.request("POST", "/v1/check", CHECK, Some(GATEWAYS)).0,
        200
    );
}

#[test]
fn only_the_admin_token_opens_the_admin_endpoints_and_it_checks_nothing() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let bridge = bridge(
        &valkey,
        &dir,
        &["--token-file", "--admin-token-file", "--config"],
    );
    for &(method, path) in ADMIN_CALLS {
        for token in [Some(GATEWAYS), None, Some("operators-s3cre"), Some("wrong")] {
            let (status, body) = bridge.request(method, path, "", token);
            assert_eq!(status, 401, "{method} {path} as {token:?}: {body}");
        }
    }
    assert_eq!(keys(&valkey), 0, "refused calls touched nothing");

    // The operators' secret is served on every endpoint.
    let served = |method, path| bridge.request(method, path, "", Some(OPERATORS));
    let (status, set) = served("PUT", ADMIN_CALLS[1].1);
    assert_eq!(status, 200, "{set}");
    let (status, list) = served("GET", "/admin/overrides");
    assert!(
        status == 200 && list.contains("rl:per-user:mallory"),
        "{list}"
    );
    let (status, usage) = served("GET", "/admin/usage?rule=per-user&value=alice");
    assert!(
        status == 200 && usage.contains("\"remaining\":3"),
        "{usage}"
    );
    let (status, cleared) = served("DELETE", "/admin/overrides?rule=per-user&value=mallory");
    assert!(
        status == 200 && cleared.contains("\"cleared\":true"),
        "{cleared}"
    );
    assert_eq!(served("POST", "/admin/overrides").0, 405);
    assert_eq!(served("GET", "/admin/anything").0, 404);

    // Neither token works in the other's place: the operators' secret checks nothing, on
    // the callout's path and on the stream's (refused before anything else is looked at).
    for path in ["/v1/check", "/ratelimit.v1.Bridge/Check"] {
        let (status, body) = bridge.request("POST", path, CHECK, Some(OPERATORS));
        assert_eq!(status, 401, "{path}: {body}");
    }
    let alice: u64 = redis::cmd("EXISTS")
        .arg("rl:per-user:alice")
        .query(&mut valkey.connection())
        .unwrap();
    assert_eq!(alice, 0, "no bucket was checked");
    let (status, reply) = bridge.request("POST", "/v1/check", CHECK, Some(GATEWAYS));
    assert!(status == 200 && reply.contains(" 1,2,"), "{reply}");
}

#[test]
fn the_bridge_refuses_to_start_with_one_token_for_both_or_a_bad_admin_token_file() {
    let dir = Scratch::new();
    // The same token, however the files are spaced: the gateways' would open /admin/.
    let gateways = dir.write("gateways", "same-s3cret\n");
    let operators = dir.write("operators", "  same-s3cret");
    let empty = dir.write("empty", "\n");
    let spaced = dir.write("spaced", "two words\n");
    let missing = dir.path().join("missing");
    let redis = format!("redis://127.0.0.1:{}", test_support::free_port());
    let with = |admin: &std::path::Path| {
        BridgeProcess::run_to_exit(&[
            "--redis",
            &redis,
            "--token-file",
            gateways.to_str().unwrap(),
            "--admin-token-file",
            admin.to_str().unwrap(),
        ])
    };
    let (status, stderr) = with(&operators);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--admin-token-file") && stderr.contains("same token as --token-file"),
        "{stderr}"
    );
    for (file, why) in [
        (&empty, "the file is empty"),
        (&spaced, "the token must be printable ASCII"),
        (&missing, "cannot read it"),
    ] {
        let (status, stderr) = with(file);
        assert!(!status.success(), "{stderr}");
        let expected = format!("--admin-token-file {}: {why}", file.display());
        assert!(stderr.contains(&expected), "{stderr}");
    }
}
