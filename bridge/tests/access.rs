//! The shared secret between gateways and the bridge: with a token file, a check without
//! exactly the right `authorization: Bearer <token>` is refused with 401 before it touches
//! Redis; `/healthz` stays open. (The gRPC stream's side is in `grpc.rs`.)

use crate::common::buckets::script_calls;
use crate::common::client::{h2c, http1, req};
use crate::common::server::start_with_token;
use crate::common::{Connect, Valkey};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{Method, Request, StatusCode};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const TOKEN: &str = "s3cret-Token";

fn check_as(authorization: &[&'static str]) -> Request<Full<Bytes>> {
    let mut request = req(Method::POST, "/v1/check", "rl:k,5,1,1000,1\n");
    for value in authorization {
        request
            .headers_mut()
            .append(AUTHORIZATION, HeaderValue::from_static(value));
    }
    request
}

fn keys(valkey: &Valkey) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut valkey.connection())
        .unwrap()
}

#[tokio::test]
async fn checks_without_exactly_the_token_are_refused_and_touch_nothing() {
    let valkey = Valkey::start();
    let bridge = start_with_token(&valkey.url(), TOKEN).await;
    let refused: [&[&'static str]; 7] = [
        &[],
        &["Bearer wrong"],
        &["Bearer s3cret-token"], // the token in another case
        &["Bearer s3cret-Toke"],  // a prefix of the token
        &["Bearer s3cret-Token", "Bearer s3cret-Token"],
        &["Bearer s3cret-Token", "Bearer wrong"],
        &["s3cret-Token"],
    ];
    for authorization in refused {
        let (status, _) = http1(bridge.addr, check_as(authorization)).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "HTTP/1.1 {authorization:?}"
        );
        let (status, _) = h2c(bridge.addr, check_as(authorization)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "h2c {authorization:?}");
    }
    assert_eq!((script_calls(&valkey), keys(&valkey)), (0, 0));
}

#[tokio::test]
async fn the_token_admits_checks_and_healthz_needs_none() {
    let valkey = Valkey::start();
    let bridge = start_with_token(&valkey.url(), TOKEN).await;
    let (status, reply) = http1(bridge.addr, check_as(&["Bearer s3cret-Token"])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.contains(" 1,4,"), "{reply}");
    let (status, reply) = h2c(bridge.addr, check_as(&["Bearer s3cret-Token"])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.contains(" 1,3,"), "{reply}");
    assert_eq!(keys(&valkey), 1);
    let (status, _) = http1(bridge.addr, req(Method::GET, "/healthz", "")).await;
    assert_eq!(status, StatusCode::OK);
}

/// The binary with `args`, against a Redis nobody listens on (it starts all the same).
fn bridge(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-bridge"));
    let listen = format!("127.0.0.1:{}", test_support::free_port());
    let redis = format!("redis://127.0.0.1:{}", test_support::free_port());
    command
        .args(["--listen", &listen, "--redis", &redis])
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

#[test]
fn the_bridge_refuses_to_start_on_an_empty_or_unreadable_token_file() {
    let empty = std::env::temp_dir().join(format!("ratelimit-empty-token-{}", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let missing = empty.with_extension("missing");
    for (file, why) in [(&empty, "the file is empty"), (&missing, "cannot read it")] {
        let out = bridge(&["--token-file", file.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        let expected = format!("--token-file {}: {why}", file.display());
        assert!(stderr.contains(&expected), "{stderr}");
    }
    std::fs::remove_file(&empty).unwrap();
}

#[test]
fn without_a_token_file_the_bridge_warns_that_anyone_may_check() {
    let mut child = bridge(&[]).spawn().unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    // The warning is written before the bridge listens, so before "listening on".
    let lines: Vec<String> = stderr
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.contains("listening on"))
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        lines.iter().any(|l| l.contains("WARN")
            && l.contains("no --token-file: any caller that reaches the bridge may check")),
        "{lines:?}"
    );
}
