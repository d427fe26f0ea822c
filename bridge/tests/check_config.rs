//! `ratelimit-bridge check-config`: a plugin configuration judged offline by the filter's
//! own parser, with the line a gateway would log and an exit status a pipeline can act on.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use test_support::pki::Scratch;

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");

const VALID: &str = r#"{"backend": {"cluster": "ratelimit_bridge"},
  "identity": {"user": {"header": "x-user-id"}},
  "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 10, "per": "1m"}}]}"#;

fn check(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BINARY)
        .arg("check-config")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn file(dir: &Scratch, name: &str, json: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, json).unwrap();
    path.to_str().unwrap().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_configuration_the_gateway_loads_passes_with_the_gateways_line() {
    let dir = Scratch::new();
    let path = file(&dir, "plugin.json", VALID);
    let out = check(&[&path], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{path}: configured 1 rule(s)\n"));
    let out = check(&["-"], Some(VALID));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "-: configured 1 rule(s)\n");
}

#[test]
fn a_refused_configuration_fails_with_the_field_and_plain_words() {
    let dir = Scratch::new();
    let path = file(&dir, "bad.json", &VALID.replace("10,", "\"10\","));
    let out = check(&[&path], None);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains(
            "invalid plugin configuration: rules[0].limit.requests: \"10\" is a string, \
             expected a whole number, 0 or more"
        ),
        "{said}"
    );
    assert!(!said.contains("u64"), "{said}");
    assert!(text(&out.stdout).is_empty());
    // A value the parser reads but the configuration refuses.
    let path = file(&dir, "soon.json", &VALID.replace("\"1m\"", "\"soon\""));
    let said = text(&check(&[&path], None).stderr);
    assert!(
        said.contains("invalid plugin configuration: rules[0].limit.per:"),
        "{said}"
    );
}

#[test]
fn the_build_decides_which_backends_are_accepted() {
    let dir = Scratch::new();
    let higress = VALID.replace(
        r#"{"cluster": "ratelimit_bridge"}"#,
        r#"{"redis": {"cluster": "outbound|6379||redis.default.svc.cluster.local"}}"#,
    );
    let path = file(&dir, "higress.json", &higress);
    let out = check(&[&path], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("backend.redis: this build talks to the bridge"));
    let out = check(&[&path, "--build", "redis-call"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = check(&["/nonexistent/plugin.json"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read it"));
}

#[test]
fn the_rate_limit_services_yaml_is_judged_with_rls() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rls/examples");
    let out = check(&["--rls", examples], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{examples}: configured 10 rate limit service domain(s)\n")
    );
    let dir = Scratch::new();
    let path = file(
        &dir,
        "bad.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let out = check(&["--rls", &path], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "ratelimit-bridge: {path}: domain \"d\": k: unit \"fortnight\" is not second, \
             minute, hour, day, week, month or year\n"
        )
    );
    // A plugin's JSON is no rate limit service configuration.
    let path = file(&dir, "plugin.json", VALID);
    assert_eq!(check(&["--rls", &path], None).status.code(), Some(1));
}

#[test]
fn a_time_zone_the_bridges_database_lacks_is_refused() {
    let quota = |zone: &str| {
        VALID.replace(
            r#""limit": {"requests": 10, "per": "1m"}"#,
            &format!(r#""limit": {{"requests": 10, "per": "month"}}, "time_zone": "{zone}""#),
        )
    };
    let out = check(&["-"], Some(&quota("America/Argentina/Buenos_Aires")));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = check(&["-"], Some(&quota("Mars/Olympus_Mons")));
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(
        said.contains("rules[0].time_zone: no time zone \"Mars/Olympus_Mons\""),
        "{said}"
    );
}
