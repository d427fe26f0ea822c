//! `GET /metrics` as Prometheus scrapes it: OpenMetrics text, without the gateways' token,
//! parsed here line by line; the counters move by exactly what the checks sent over HTTP
//! and over the gRPC stream did, and the histograms count every script call.

use crate::common::client::{http1, req};
use crate::common::server::{start, start_with, start_with_token, without_token, Bridge, RELAXED};
use crate::common::stream::open;
use crate::common::Valkey;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use ratelimit_bridge::doors::guards::deadlines::ConnectionBounds;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const P: &str = "ratelimit_bridge_";

/// One scrape: each sample's value by its name and its labels (sorted).
#[derive(Debug, Clone)]
struct Scrape(BTreeMap<(String, Vec<(String, String)>), f64>);

impl Scrape {
    /// `name` (without the bridge's prefix) with exactly `labels`, if it was exposed.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        self.0.get(&(format!("{P}{name}"), labels)).copied()
    }

    /// The same, 0 when not exposed (a family without that label set yet).
    fn at(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// The sum over every label set of `name` whose labels include `having`.
    fn sum(&self, name: &str, having: &[(&str, &str)]) -> f64 {
        let name = format!("{P}{name}");
        self.0
            .iter()
            .filter(|((n, labels), _)| {
                *n == name
                    && having
                        .iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// Parses the text exposition format; any line that is not a comment, a blank or a sample
/// `name{k="v",...} value` fails the test, and so does a missing `# EOF`.
fn parse(text: &str) -> Scrape {
    assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line:?}"));
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line:?}"
        );
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            rest = inner;
            loop {
                let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line:?}"));
                let mut value = String::new();
                let mut chars = after.char_indices();
                let close = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c)) => value.push(c),
                            None => panic!("{line:?}"),
                        },
                        Some((i, '"')) => break i,
                        Some((_, c)) => value.push(c),
                        None => panic!("unterminated label value: {line:?}"),
                    }
                };
                labels.push((key.to_string(), value));
                rest = &after[close + 1..];
                if let Some(more) = rest.strip_prefix(',') {
                    rest = more;
                } else {
                    rest = rest.strip_prefix('}').unwrap_or_else(|| panic!("{line:?}"));
                    break;
                }
            }
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("{line:?}")),
        };
        labels.sort();
        let key = (name.to_string(), labels);
        assert!(samples.insert(key, value).is_none(), "twice: {line:?}");
    }
    Scrape(samples)
}

/// `GET /metrics` over HTTP/1.1, without a token: checks the status and content type.
async fn scrape(bridge: &Bridge) -> Scrape {
    try_scrape(bridge)
        .await
        .expect("the bridge answers /metrics")
}

/// The same, `None` if the bridge closed the connection unanswered (at its cap).
async fn try_scrape(bridge: &Bridge) -> Option<Scrape> {
    let io = TokioIo::new(TcpStream::connect(bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
    tokio::spawn(conn);
    let response = sender
        .send_request(req(Method::GET, "/metrics", ""))
        .await
        .ok()?;
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Some(parse(std::str::from_utf8(&body).unwrap()))
}

/// Scrapes until `ready` holds (connections and streams close asynchronously, and free
/// their slots so), 5 s at most.
async fn scrape_until(bridge: &Bridge, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let scraped = try_scrape(bridge).await;
        if let Some(scraped) = scraped.as_ref().filter(|s| ready(s)) {
            return scraped.clone();
        }
        assert!(Instant::now() < deadline, "never ready: {scraped:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn outcomes(s: &Scrape) -> [f64; 4] {
    ["allowed", "denied", "failed", "refused"].map(|o| s.at("checks_total", &[("outcome", o)]))
}

#[tokio::test]
async fn metrics_count_checks_exchanges_and_script_calls_over_http_and_the_stream() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let before = scrape(&bridge).await;
    // Every outcome and failure kind reads 0 before anything happened, as counters should.
    for outcome in ["allowed", "denied", "failed", "refused"] {
        let labels = [("outcome", outcome)];
        assert_eq!(
            before.value("checks_total", &labels),
            Some(0.0),
            "{before:?}"
        );
    }
    assert_eq!(
        before.value("failures_total", &[("kind", "bad_batch")]),
        Some(0.0)
    );
    // Over HTTP, one exchange: three checks on a bucket of two (allowed, allowed, denied)
    // and a key outside the bridge's prefixes (refused): one script call of three checks.
    let body = "rl:m:a,2,1,1000,1\nrl:m:a,2,1,1000,1\nrl:m:a,2,1,1000,1\nsession:1,1,1,1,1\n";
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply.lines().count(), 4, "{reply}");
    // On the stream, one message: two checks on a bucket of one (allowed, denied) and an
    // unreadable line (refused): one script call of two checks.
    let (status, mut stream) = open(&bridge).await;
    assert_eq!(status, StatusCode::OK);
    stream
        .send("7\nrl:m:b,1,1,1000,1\nrl:m:b,1,1,1000,1\nbad key,1,1,1,1\n")
        .await;
    let answer = stream.next().await.unwrap();
    assert_eq!(answer.lines().count(), 4, "{answer}");
    let open_now = scrape(&bridge).await;
    assert_eq!(
        open_now.value("grpc_streams", &[]),
        Some(1.0),
        "{open_now:?}"
    );
    // The stream's connection and this scrape's.
    assert!(open_now.at("connections", &[]) >= 2.0, "{open_now:?}");
    // A body that is no batch at all: an exchange, a failure, no check, no script call.
    let (status, _) = http1(bridge.addr, req(Method::POST, "/v1/check", "")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    stream.send.take();
    assert_eq!(stream.next().await, Err("0".into()));
    drop(stream); // and with it the stream's connection
    let after = scrape_until(&bridge, |s| {
        s.at("grpc_streams", &[]) == 0.0 && s.at("connections", &[]) == 1.0
    })
    .await;

    let delta =
        |name: &str, labels: &[(&str, &str)]| after.at(name, labels) - before.at(name, labels);
    let [allowed, denied, failed, refused] = outcomes(&after);
    assert_eq!((allowed, denied, failed, refused), (3.0, 2.0, 0.0, 2.0));
    assert_eq!(delta("exchanges_total", &[("transport", "http")]), 2.0);
    assert_eq!(delta("exchanges_total", &[("transport", "grpc")]), 1.0);
    assert_eq!(delta("failures_total", &[("kind", "bad_batch")]), 1.0);
    assert_eq!(after.sum("failures_total", &[]), 1.0, "{after:?}");
    let calls = [("node", "single"), ("mode", "check")];
    assert_eq!(delta("script_calls_total", &calls), 2.0, "{after:?}");
    assert_eq!(after.sum("script_calls_total", &[]), 2.0, "{after:?}");
    assert_eq!(after.sum("script_call_failures_total", &[]), 0.0);
    // One observation per script call in each histogram: 3 + 2 checks, as many rules.
    assert_eq!(after.at("batch_checks_count", &[]), 2.0);
    assert_eq!(after.at("batch_checks_sum", &[]), 5.0);
    assert_eq!(after.at("batch_checks_bucket", &[("le", "2.0")]), 1.0);
    assert_eq!(after.at("batch_checks_bucket", &[("le", "4.0")]), 2.0);
    assert_eq!(after.at("batch_rules_count", &[]), 2.0);
    assert_eq!(after.at("batch_rules_sum", &[]), 5.0);
    let single = [("node", "single")];
    assert_eq!(after.at("redis_call_seconds_count", &single), 2.0);
    let inf = [("node", "single"), ("le", "+Inf")];
    assert_eq!(after.at("redis_call_seconds_bucket", &inf), 2.0);
    let seconds = after.at("redis_call_seconds_sum", &single);
    assert!(seconds > 0.0 && seconds < 4.0, "{seconds}");
    // The two exchanges answered (the one that is no batch is not), each timed whole.
    assert_eq!(after.at("exchange_seconds_count", &[]), 2.0, "{after:?}");
    assert!(after.at("exchange_seconds_sum", &[]) >= seconds);
}

#[tokio::test]
async fn a_check_redis_fails_counts_as_failed_with_its_script_calls_failure_kind() {
    let valkey = Valkey::start();
    let bridge = start(&valkey.url()).await;
    let body = "rl:m:c,5,1,1000,1\n";
    let (_, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert!(reply.contains(" 1,"), "{reply}");
    drop(valkey);
    let (status, reply) = http1(bridge.addr, req(Method::POST, "/v1/check", body)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(reply.starts_with("! "), "{reply}");
    let after = scrape(&bridge).await;
    assert_eq!(outcomes(&after), [1.0, 0.0, 1.0, 0.0], "{after:?}");
    let single = [("node", "single")];
    let calls = [("node", "single"), ("mode", "check")];
    assert_eq!(after.at("script_calls_total", &calls), 2.0, "{after:?}");
    // The failed call is timed and counted like the other, under one kind.
    assert_eq!(after.at("redis_call_seconds_count", &single), 2.0);
    assert_eq!(after.at("batch_checks_count", &[]), 2.0);
    assert_eq!(
        after.sum("script_call_failures_total", &single),
        1.0,
        "{after:?}"
    );
    let kinds: Vec<&str> = after
        .0
        .iter()
        .filter(|((n, _), v)| n.ends_with("script_call_failures_total") && **v > 0.0)
        .flat_map(|((_, labels), _)| labels.iter().filter(|(k, _)| k == "kind"))
        .map(|(_, kind)| kind.as_str())
        .collect();
    assert!(
        kinds == ["io"] || kinds == ["timeout"],
        "a dead server is an I/O failure: {kinds:?}"
    );
}

#[tokio::test]
async fn metrics_need_no_token_and_count_the_exchanges_refused_without_it() {
    let valkey = Valkey::start();
    let bridge = start_with_token(&valkey.url(), "s3cret").await;
    let (status, _) = http1(
        bridge.addr,
        req(Method::POST, "/v1/check", "rl:t,1,1,1,1\n"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = http1(bridge.addr, req(Method::POST, "/metrics", "")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let after = scrape(&bridge).await;
    assert_eq!(after.at("failures_total", &[("kind", "unauthorized")]), 1.0);
    assert_eq!(after.sum("failures_total", &[]), 1.0, "{after:?}");
    assert_eq!(outcomes(&after), [0.0; 4]);
    assert_eq!(after.sum("exchanges_total", &[]), 0.0);
    assert_eq!(after.sum("script_calls_total", &[]), 0.0);
}

#[tokio::test]
async fn a_connection_past_the_cap_and_a_late_body_count_as_failures() {
    let valkey = Valkey::start();
    let bounds = ConnectionBounds {
        body_timeout: Duration::from_secs(1),
        max_connections: 2,
        ..RELAXED
    };
    let bridge = start_with(&valkey.url(), without_token(bounds)).await;
    // Two slots: one held by a check whose body stops short, one by an idle connection.
    let head = "POST /v1/check HTTP/1.1\r\nhost: bridge\r\ncontent-length: 10\r\n\r\nrl:";
    let stalled_check = || async {
        let mut conn = TcpStream::connect(bridge.addr).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        conn
    };
    let mut late = stalled_check().await;
    let mut idle = TcpStream::connect(bridge.addr).await.unwrap();
    // A third takes the idle one's slot: it had checked nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = stalled_check().await;
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
    assert_eq!(read.unwrap().unwrap(), 0, "the idle connection is closed");
    // A fourth finds every slot held by a connection that checked: it is closed unanswered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = TcpStream::connect(bridge.addr).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut buf)).await;
    assert_eq!(
        read.unwrap().unwrap(),
        0,
        "a fourth connection is closed unanswered"
    );
    for conn in [&mut late, &mut third] {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    drop((late, idle, third, refused));
    // A scrape sent before the bridge has seen them close is refused too, and counted.
    let mut scrapes_refused = 0.0;
    let after = loop {
        match try_scrape(&bridge).await {
            Some(s) if s.at("connections", &[]) == 1.0 => break s,
            Some(_) => {}
            None => scrapes_refused += 1.0,
        }
        assert!(scrapes_refused < 100.0, "the slots never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let over = after.at("failures_total", &[("kind", "over_capacity")]);
    assert_eq!(over, 1.0 + scrapes_refused);
    // The idle one, and maybe a scrape the bridge had not yet seen close.
    assert!(after.at("failures_total", &[("kind", "evicted")]) >= 1.0);
    assert_eq!(after.at("failures_total", &[("kind", "body_timeout")]), 2.0);
    assert_eq!(after.sum("exchanges_total", &[]), 0.0, "{after:?}");
}
