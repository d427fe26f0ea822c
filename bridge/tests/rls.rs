//! The bridge as Envoy's Rate Limit Service: `ShouldRateLimit` calls over h2c, as Envoy's
//! `ratelimit` filter makes them, answered from the token buckets in a real Valkey, with
//! envoyproxy/ratelimit's YAML configuration read from a file and reloaded when it changes.

use crate::common::client::{h2c, req};
use crate::common::prefixed;
use crate::common::server::{start_with, without_token, Bridge, RELAXED};
use crate::common::Valkey;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use ratelimit_bridge::doors::guards::access::Access;
use ratelimit_bridge::doors::rls::answer::ResponseHeaders;
use ratelimit_bridge::doors::rls::proto::{
    Entry, LimitOverride, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, UInt64Value,
    CODE_OK, CODE_OVER_LIMIT, PATH,
};
use ratelimit_bridge::doors::rls::Rls;
use ratelimit_protocol::Deframer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: plan
    value: basic
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2, name: basic}
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: basic}]}
";

/// A configuration file of its own, removed when dropped.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(text: &str) -> ConfigFile {
        let path = std::env::temp_dir().join(format!(
            "rls-{}-{:?}.yaml",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, text).unwrap();
        ConfigFile(path)
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn serving(valkey: &Valkey, file: &ConfigFile, access: Access) -> (Bridge, Arc<Rls>) {
    let rls = Arc::new(Rls::load(file.0.clone(), "rl", ResponseHeaders::Draft03).unwrap());
    let mut config = without_token(RELAXED);
    config.access = access;
    config.rls = Some(Arc::clone(&rls));
    (start_with(&valkey.url(), config).await, rls)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// One call: the response message, or the gRPC status it ended with instead.
async fn call_raw(
    bridge: &Bridge,
    body: Bytes,
    token: Option<&str>,
) -> Result<RateLimitResponse, (u32, String)> {
    let io = TokioIo::new(TcpStream::connect(bridge.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut request = Request::post(format!("http://bridge{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    if response.status() != StatusCode::OK {
        return Err((u32::from(response.status().as_u16()), "http".into()));
    }
    let status_of = |map: &hyper::HeaderMap| {
        map.get("grpc-status")
            .map(|v| v.to_str().unwrap().parse::<u32>().unwrap())
            .map(|s| {
                let why = map.get("grpc-message").map_or("", |m| m.to_str().unwrap());
                (s, why.to_string())
            })
    };
    if let Some(status) = status_of(response.headers()) {
        return Err(status);
    }
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap();
    let mut deframer = Deframer::default();
    deframer.push(&collected.to_bytes());
    let message = deframer.next_message().unwrap().unwrap();
    match status_of(&trailers) {
        Some((0, _)) => Ok(RateLimitResponse::decode(message.as_slice()).unwrap()),
        Some(other) => Err(other),
        None => panic!("no grpc-status"),
    }
}

async fn call(bridge: &Bridge, request: &RateLimitRequest) -> RateLimitResponse {
    call_raw(bridge, prefixed(&request.encode_to_vec()), None)
        .await
        .unwrap()
}

fn codes(response: &RateLimitResponse) -> Vec<i32> {
    response.statuses.iter().map(|s| s.code).collect()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    let found = response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name);
    found.map(|h| h.value.as_str())
}

#[tokio::test]
async fn a_descriptor_gets_exactly_its_limit_with_statuses_and_headers() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    let alice = request(vec![descriptor(&[("user", "alice")])]);
    for left in [2, 1, 0] {
        let answer = call(&bridge, &alice).await;
        assert_eq!(answer.overall_code, CODE_OK);
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, left);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 2));
        assert_eq!(header(&answer, "x-ratelimit-limit"), Some("3, 3;w=60"));
        assert_eq!(
            header(&answer, "x-ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
        assert!(header(&answer, "retry-after").is_none());
    }
    let over = call(&bridge, &alice).await;
    assert_eq!(
        (over.overall_code, codes(&over)),
        (CODE_OVER_LIMIT, vec![CODE_OVER_LIMIT])
    );
    // A token comes back every 20 s.
    let retry: u64 = header(&over, "retry-after").unwrap().parse().unwrap();
    assert!((19..=20).contains(&retry), "{retry}");
    let reset = over.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!((59..=60).contains(&reset.seconds), "{reset:?}");
    // Another user has a bucket of its own; an unknown descriptor has no limit.
    let bob = call(&bridge, &request(vec![descriptor(&[("user", "bob")])])).await;
    assert_eq!(bob.overall_code, CODE_OK);
    let none = call(&bridge, &request(vec![descriptor(&[("nothing", "x")])])).await;
    assert_eq!(
        (none.overall_code, none.statuses[0].current_limit.clone()),
        (CODE_OK, None)
    );
    assert!(none.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn descriptors_are_checked_all_or_nothing_with_the_request_hits() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    let both = |hits| RateLimitRequest {
        hits_addend: hits,
        ..request(vec![
            descriptor(&[("team", "t")]),
            descriptor(&[("user", "carol")]),
        ])
    };
    // 2 + 2 hits would pass the team's 10 but not carol's 3: nothing is taken from either.
    assert_eq!(call(&bridge, &both(2)).await.overall_code, CODE_OK);
    let over = call(&bridge, &both(2)).await;
    assert_eq!(codes(&over), [CODE_OK, CODE_OVER_LIMIT]);
    let team = call(&bridge, &request(vec![descriptor(&[("team", "t")])])).await;
    assert_eq!(team.statuses[0].limit_remaining, 7);
    // The same descriptor twice in one call takes its hits twice: 2 of dan's 3, then the
    // next call's 2 do not fit.
    let twice = request(vec![
        descriptor(&[("user", "dan")]),
        descriptor(&[("user", "dan")]),
    ]);
    let first = call(&bridge, &twice).await;
    assert_eq!(
        (first.overall_code, first.statuses[1].limit_remaining),
        (CODE_OK, 1)
    );
    assert_eq!(call(&bridge, &twice).await.overall_code, CODE_OVER_LIMIT);
    // More hits than the bucket holds are over without asking Redis.
    let huge = RateLimitRequest {
        hits_addend: 11,
        ..request(vec![descriptor(&[("team", "u")])])
    };
    assert_eq!(call(&bridge, &huge).await.overall_code, CODE_OVER_LIMIT);
}

#[tokio::test]
async fn a_descriptors_own_hits_are_a_cost_taken_in_full_and_zero_only_asks() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    let tokens = |hits: Option<u64>| {
        let mut d = descriptor(&[("tokens", "dave")]);
        d.hits_addend = hits.map(|value| UInt64Value { value });
        request(vec![d])
    };
    let asked = call(&bridge, &tokens(Some(0))).await;
    assert_eq!(
        (asked.overall_code, asked.statuses[0].limit_remaining),
        (CODE_OK, 100)
    );
    // What a stream reported at its end: 70, then 45 of 100. The second is taken in full
    // (15 into debt) and said to be over.
    let first = call(&bridge, &tokens(Some(70))).await;
    assert_eq!(
        (first.overall_code, first.statuses[0].limit_remaining),
        (CODE_OK, 30)
    );
    let second = call(&bridge, &tokens(Some(45))).await;
    assert_eq!(second.overall_code, CODE_OVER_LIMIT);
    // The next request's ask finds the debt: over, with nothing taken.
    for _ in 0..2 {
        assert_eq!(
            call(&bridge, &tokens(Some(0))).await.overall_code,
            CODE_OVER_LIMIT
        );
    }
    // A cost never passes one bucket of debt.
    call(&bridge, &tokens(Some(1_000_000))).await;
    let mut model = redis::Client::open(valkey.url()).unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg("rl:rls:api:tokens:dave")
        .query(&mut model)
        .unwrap();
    assert_eq!(exists, 1);
    // Each cost leaves the record that applies it once, which expires.
    let records: Vec<String> = redis::cmd("KEYS")
        .arg("rl:rls:*{*")
        .query(&mut model)
        .unwrap();
    assert_eq!(records.len(), 3, "{records:?}");
    for record in records {
        let ttl: i64 = redis::cmd("PTTL").arg(&record).query(&mut model).unwrap();
        assert!(ttl > 0, "{record}: {ttl}");
    }
}

#[tokio::test]
async fn shadow_unlimited_blocked_overrides_and_replaces() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    for _ in 0..3 {
        let shadow = call(&bridge, &request(vec![descriptor(&[("shadow", "s")])])).await;
        assert_eq!(shadow.overall_code, CODE_OK);
        let free = call(&bridge, &request(vec![descriptor(&[("free", "f")])])).await;
        assert_eq!(free.overall_code, CODE_OK);
        // As envoyproxy/ratelimit answers an unlimited descriptor.
        assert_eq!(free.statuses[0].limit_remaining, u32::MAX);
        let banned = call(&bridge, &request(vec![descriptor(&[("banned", "b")])])).await;
        assert_eq!(banned.overall_code, CODE_OVER_LIMIT);
    }
    // The caller's limit: 1 per second for this descriptor, in place of 3 per minute.
    let mut erin = descriptor(&[("user", "erin")]);
    erin.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: 1,
    });
    let once = call(&bridge, &request(vec![erin.clone()])).await;
    assert_eq!(once.statuses[0].current_limit.as_ref().unwrap().unit, 1);
    assert_eq!(
        call(&bridge, &request(vec![erin.clone()]))
            .await
            .overall_code,
        CODE_OVER_LIMIT
    );
    // Gold's limit replaces basic's when both apply: 5, not 2.
    let both = request(vec![
        descriptor(&[("plan", "basic"), ("user", "frank")]),
        descriptor(&[("plan", "gold"), ("user", "frank")]),
    ]);
    let answers: Vec<i32> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(call(&bridge, &both).await.overall_code);
        }
        v
    };
    assert_eq!(answers, [1, 1, 1, 1, 1, 2]);
    let scraped = h2c(bridge.addr, req(Method::GET, "/metrics", "")).await.1;
    for series in [
        "ratelimit_bridge_rls_shadow_mode_total{domain=\"api\",key=\"shadow\"} 2",
        "ratelimit_bridge_rls_over_limit_total{domain=\"api\",key=\"banned\"} 3",
        "ratelimit_bridge_rls_within_limit_total{domain=\"api\",key=\"free\"} 3",
        "ratelimit_bridge_rls_total_hits_total{domain=\"api\",key=\"user\"} 2",
        // Of 5, the hits past floor(0.8 x 5) = 4 used: the 5th, as envoyproxy/ratelimit.
        "ratelimit_bridge_rls_near_limit_total{domain=\"api\",key=\"plan_gold.user\"} 1",
    ] {
        assert!(scraped.contains(series), "{series} in\n{scraped}");
    }
}

#[tokio::test]
async fn bad_calls_fail_alone_and_the_token_is_required() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let token_file = std::env::temp_dir().join(format!("rls-token-{}", std::process::id()));
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let access = Access::from_token_file(&token_file).unwrap();
    std::fs::remove_file(&token_file).unwrap();
    let (bridge, _) = serving(&valkey, &file, access).await;
    let good = prefixed(&request(vec![descriptor(&[("user", "gina")])]).encode_to_vec());
    assert_eq!(
        call_raw(&bridge, good.clone(), None).await.unwrap_err().0,
        401
    );
    assert_eq!(
        call_raw(&bridge, good.clone(), Some("wrong"))
            .await
            .unwrap_err()
            .0,
        401
    );
    let users = |n: usize| -> Vec<RateLimitDescriptor> {
        let named: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
        named.iter().map(|u| descriptor(&[("user", u)])).collect()
    };
    let invalid =
        |body: Bytes| async { call_raw(&bridge, body, Some("s3cret")).await.unwrap_err() };
    for (body, why) in [
        (
            Bytes::from_static(b"\x00\x00\x00\x00\x05\xff\xff"),
            "not one whole message",
        ),
        (prefixed(b"\xff\xff\xff"), "unreadable"),
        (
            prefixed(&RateLimitRequest::default().encode_to_vec()),
            "rate limit domain must not be empty",
        ),
        (
            prefixed(&request(users(33)).encode_to_vec()),
            "more than 32 limited descriptors",
        ),
        (
            prefixed(&request(Vec::new()).encode_to_vec()),
            "descriptor list must not be empty",
        ),
        (
            prefixed(
                &request(vec![RateLimitDescriptor {
                    limit: Some(LimitOverride {
                        requests_per_unit: 1,
                        unit: 99,
                    }),
                    ..descriptor(&[("user", "x")])
                }])
                .encode_to_vec(),
            ),
            "unit 99 is unknown",
        ),
    ] {
        let (status, message) = invalid(body).await;
        assert_eq!(status, 3, "{message}");
        assert!(message.contains(why), "{message}");
    }
    // Hostile values are escaped into the key's grammar, never a separator or a hash tag.
    let odd = request(vec![descriptor(&[("user", "a:b{c}")])]);
    let answer = call_raw(&bridge, prefixed(&odd.encode_to_vec()), Some("s3cret")).await;
    assert_eq!(answer.unwrap().overall_code, CODE_OK);
    let answer = call_raw(&bridge, good, Some("s3cret")).await.unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    let mut model = redis::Client::open(valkey.url()).unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:rls:*")
        .query(&mut model)
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["rl:rls:api:user:a%3Ab%7Bc%7D", "rl:rls:api:user:gina"]
    );
}

#[tokio::test]
async fn a_changed_file_is_read_again_keeping_the_buckets_and_a_broken_one_is_not() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, rls) = serving(&valkey, &file, Access::open()).await;
    let watching = tokio::spawn(rls.watch());
    let henry = request(vec![descriptor(&[("user", "henry")])]);
    assert_eq!(call(&bridge, &henry).await.statuses[0].limit_remaining, 2);
    std::fs::write(
        &file.0,
        CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 4}"),
    )
    .unwrap();
    let limit_of = |answer: RateLimitResponse| answer.statuses[0].current_limit.clone().unwrap();
    let mut waited = Duration::ZERO;
    let reloaded = loop {
        let answer = call(&bridge, &henry).await;
        if limit_of(answer.clone()).requests_per_unit == 4 {
            break answer;
        }
        assert!(waited < Duration::from_secs(20), "never reloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += Duration::from_millis(200);
    };
    // The bucket went on: of 4, at least one of the earlier calls is still spent.
    assert!(reloaded.statuses[0].limit_remaining < 3, "{reloaded:?}");
    std::fs::write(&file.0, "domain: api\nbroken: [\n").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(limit_of(call(&bridge, &henry).await).requests_per_unit, 4);
    watching.abort();
}

#[tokio::test]
async fn a_reservation_is_checked_whole_and_its_commit_settles_the_difference() {
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    let marked = |marker: (&str, &str), hits: u64| {
        let mut d = descriptor(&[("tokens", "ivy"), marker]);
        d.hits_addend = Some(UInt64Value { value: hits });
        request(vec![d])
    };
    let remaining = |answer: &RateLimitResponse| answer.statuses[0].limit_remaining;
    // What the answer says was reserved, for the commit to name.
    let reserved = |answer: &RateLimitResponse| {
        let fields = &answer.dynamic_metadata.as_ref()?.fields;
        fields
            .get("ratelimit.reserved")?
            .as_str()
            .map(str::to_owned)
    };
    // Two streams reserve 60 of 100 each: the second does not fit and takes nothing.
    let first = call(&bridge, &marked(("ratelimit.reserve", "1"), 60)).await;
    assert_eq!((first.overall_code, remaining(&first)), (CODE_OK, 40));
    assert_eq!(reserved(&first).as_deref(), Some("60"));
    let second = call(&bridge, &marked(("ratelimit.reserve", "1"), 60)).await;
    assert_eq!(
        (second.overall_code, remaining(&second)),
        (CODE_OVER_LIMIT, 40)
    );
    assert_eq!(reserved(&second).as_deref(), Some("0"));
    // The first used 20 of its 60: 40 come back.
    let commit = call(&bridge, &marked(("ratelimit.reserved", "60"), 20)).await;
    assert_eq!((commit.overall_code, remaining(&commit)), (CODE_OK, 80));
    // One that used 150 of 60 pays the 90 more, 10 of them in debt.
    call(&bridge, &marked(("ratelimit.reserve", "1"), 60)).await;
    let over = call(&bridge, &marked(("ratelimit.reserved", "60"), 150)).await;
    assert_eq!(over.overall_code, CODE_OVER_LIMIT);
    let asked = call(&bridge, &marked(("ratelimit.reserve", "1"), 0)).await;
    assert_eq!(
        (asked.overall_code, remaining(&asked)),
        (CODE_OVER_LIMIT, 0)
    );
    assert_eq!(
        reserved(&asked).as_deref(),
        Some("0"),
        "a check of 0 takes nothing"
    );
    assert_eq!(reserved(&over), None, "a commit reserves nothing");
    // The markers are not part of the bucket's key.
    let mut model = redis::Client::open(valkey.url()).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:rls:api:tokens:*")
        .query(&mut model)
        .unwrap();
    assert!(
        keys.iter().all(|k| k.starts_with("rl:rls:api:tokens:ivy")),
        "{keys:?}"
    );
    // A commit without its usage fails alone.
    let d = descriptor(&[("tokens", "ivy"), ("ratelimit.reserved", "60")]);
    let body = prefixed(&request(vec![d]).encode_to_vec());
    assert_eq!(call_raw(&bridge, body, None).await.unwrap_err().0, 3);
}

#[tokio::test]
async fn a_commit_naming_what_envoy_would_not_have_reserved_pays_its_usage_in_full() {
    // Envoy reads a `hits_addend` format as a double: it sends no reservation for
    // 2000000000, -5 or x, and one of 0 for 0.5 or 1e-3. A commit naming any of them gave
    // back what was never taken, or was refused and charged nothing.
    let valkey = Valkey::start();
    let file = ConfigFile::new(CONFIG);
    let (bridge, _) = serving(&valkey, &file, Access::open()).await;
    for (i, named) in ["2000000000", "0.5", "1e-3", "-5", "x", " 30 ,30", "nan"]
        .into_iter()
        .enumerate()
    {
        let user = format!("u{i}");
        let mut commit = descriptor(&[("tokens", &user), ("ratelimit.reserved", named)]);
        commit.hits_addend = Some(UInt64Value { value: 30 });
        let answer = call(&bridge, &request(vec![commit])).await;
        assert_eq!(
            (answer.overall_code, answer.statuses[0].limit_remaining),
            (CODE_OK, 70),
            "{named:?}"
        );
    }
    // Envoy's own forms of a number read as Envoy reads them: 30 reserved, 30 used.
    for (i, named) in ["30", "+30", " 30\t", "30.9", "3e1"]
        .into_iter()
        .enumerate()
    {
        let user = format!("v{i}");
        let mut reserve = descriptor(&[("tokens", &user), ("ratelimit.reserve", "1")]);
        reserve.hits_addend = Some(UInt64Value { value: 30 });
        call(&bridge, &request(vec![reserve])).await;
        let mut commit = descriptor(&[("tokens", &user), ("ratelimit.reserved", named)]);
        commit.hits_addend = Some(UInt64Value { value: 30 });
        let answer = call(&bridge, &request(vec![commit])).await;
        assert_eq!(answer.statuses[0].limit_remaining, 70, "{named:?}");
    }
}
