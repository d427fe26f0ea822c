//! The rate limit service held to envoyproxy/ratelimit's answers where issue 50 found them
//! apart, one test per row: what that service answers (read from its source), or what
//! docs/rate-limit-service.md's "What differs" says instead. Each runs the bridge in
//! process against a real Valkey and calls it over h2c as Envoy does.

use crate::common::client::{h2c, req};
use crate::common::rls::{call, serve, Served};
use crate::common::server::{start_with, without_token, RELAXED};
use crate::common::Valkey;
use hyper::Method;
use ratelimit_bridge::doors::rls::answer::{Headers, ResponseHeaders};
use ratelimit_bridge::doors::rls::compat::translate;
use ratelimit_bridge::doors::rls::proto::{
    Entry, Kind, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, UInt64Value, Value,
    CODE_OK, CODE_OVER_LIMIT,
};
use ratelimit_bridge::doors::rls::{Options, Rls};
use std::collections::HashMap;
use std::sync::Arc;
use test_support::pki::Scratch;

/// A descriptor's entries, as a case table writes them.
type Entries<'a> = &'a [(&'a str, &'a str)];

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    let descriptor = |entries: &&[(&str, &str)]| RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    };
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(descriptor).collect(),
        hits_addend: 0,
    }
}

fn headers(answer: &RateLimitResponse) -> Vec<(String, String)> {
    let pairs = answer.response_headers_to_add.iter();
    pairs.map(|h| (h.key.clone(), h.value.clone())).collect()
}

/// What the bridge's variables are, started from envoyproxy/ratelimit's `vars`.
fn translated(vars: &[(&str, &str)]) -> HashMap<&'static str, String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    translate(|name| vars.get(name).cloned())
        .unwrap()
        .into_iter()
        .collect()
}

const USERS: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
";

/// Row 1: started the reference's way, no headers unless `LIMIT_RESPONSE_HEADERS_ENABLED`,
/// then `RateLimit-Limit`, `-Remaining`, `-Reset` as it writes them, renamable.
#[tokio::test]
async fn response_headers_are_the_references_when_started_its_way() {
    let root = [("RUNTIME_ROOT", "/data")];
    let off = translated(&root);
    assert_eq!(off["RATELIMIT_BRIDGE_RLS_RESPONSE_HEADERS"], "off");
    let on = translated(&[
        ("RUNTIME_ROOT", "/data"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "T"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
    ]);
    assert_eq!(on["RATELIMIT_BRIDGE_RLS_RESPONSE_HEADERS"], "reference");
    assert_eq!(on["RATELIMIT_BRIDGE_RLS_REMAINING_HEADER"], "X-Left");
    assert!(!on.contains_key("RATELIMIT_BRIDGE_RLS_LIMIT_HEADER"));
    // Started with the bridge's own flags, nothing of theirs is read.
    assert!(translated(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).is_empty());

    let alice = request("api", &[&[("user", "alice")]]);
    let served = serve(&[("api.yaml", USERS)], ResponseHeaders::Off).await;
    assert_eq!(headers(&call(&served, &alice).await.unwrap()), []);
    let named = Headers {
        remaining: "X-Left".into(),
        ..Headers::from(ResponseHeaders::Reference)
    };
    let served = serve(&[("api.yaml", USERS)], named).await;
    for left in ["2", "1", "0"] {
        let answer = call(&served, &alice).await.unwrap();
        let got = headers(&answer);
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["RateLimit-Limit", "X-Left", "RateLimit-Reset"]);
        assert_eq!((got[0].1.as_str(), got[1].1.as_str()), ("3", left));
        let reset: u64 = got[2].1.parse().unwrap();
        assert!((1..=60).contains(&reset), "{reset}");
    }
    let over = headers(&call(&served, &alice).await.unwrap());
    assert_eq!(over.len(), 3, "no retry-after of the bridge's: {over:?}");
    assert_eq!(over[1].1, "0");
}

/// Row 2: `SHADOW_MODE=true` lets every call through, counted as shadow, each descriptor
/// still saying where it stands.
#[tokio::test]
async fn shadow_mode_answers_every_call_ok_and_counts_it() {
    let vars = [("RUNTIME_ROOT", "/data"), ("SHADOW_MODE", "1")];
    assert_eq!(
        translated(&vars)["RATELIMIT_BRIDGE_RLS_SHADOW_MODE"],
        "true"
    );
    let options = Options {
        shadow: true,
        ..Options::from(ResponseHeaders::Off)
    };
    let served = serve(&[("api.yaml", USERS)], options).await;
    let alice = request("api", &[&[("user", "alice")]]);
    for _ in 0..3 {
        assert_eq!(call(&served, &alice).await.unwrap().overall_code, CODE_OK);
    }
    for _ in 0..2 {
        let answer = call(&served, &alice).await.unwrap();
        assert_eq!(answer.overall_code, CODE_OK);
        assert_eq!(answer.statuses[0].code, CODE_OVER_LIMIT);
    }
    let scraped = h2c(served.bridge.addr, req(Method::GET, "/metrics", ""))
        .await
        .1;
    let counted = "ratelimit_bridge_rls_shadow_mode_total{domain=\"api\",key=\"user\"} 2";
    assert!(scraped.contains(counted), "{scraped}");
    assert!(
        !scraped.contains("ratelimit_bridge_rls_over_limit_total{"),
        "{scraped}"
    );
}

/// Row 2: `MERGE_DOMAIN_CONFIG=true` merges the files of one domain (the same descriptor
/// in two of them still refused); without it, a domain twice is refused.
#[tokio::test]
async fn merge_domain_config_merges_one_domains_files() {
    let vars = [("RUNTIME_ROOT", "/data"), ("MERGE_DOMAIN_CONFIG", "true")];
    assert_eq!(
        translated(&vars)["RATELIMIT_BRIDGE_RLS_MERGE_DOMAINS"],
        "true"
    );
    let teams = "
domain: api
descriptors:
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let files = [("a.yaml", USERS), ("b.yaml", teams)];
    let merging = Options {
        merge: true,
        ..Options::from(ResponseHeaders::Off)
    };
    let dir = Scratch::new();
    for (name, text) in files {
        dir.write(name, text);
    }
    let path = dir.path().to_owned();
    let refused = Rls::load(path.clone(), "rl", ResponseHeaders::Off).err();
    assert!(refused.unwrap().contains("configured twice"));
    dir.write("c.yaml", teams);
    let twice = Rls::load(path, "rl", merging.clone()).err();
    assert!(twice.unwrap().contains("team: the same descriptor"));

    let served = serve(&files, merging).await;
    let both = request("api", &[&[("user", "u")], &[("team", "t")]]);
    let first = call(&served, &both).await.unwrap();
    let limits: Vec<u32> = first
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().unwrap().requests_per_unit)
        .collect();
    assert_eq!((first.overall_code, limits), (CODE_OK, vec![3, 1]));
    assert_eq!(
        call(&served, &both).await.unwrap().overall_code,
        CODE_OVER_LIMIT
    );
}

/// Row 3: `value_to_metric`, `detailed_metric` and `metadata` (any YAML under it) load, as
/// envoyproxy/ratelimit's test/config/metadata.yaml does there, and with its
/// `RESPONSE_DYNAMIC_METADATA` the answer carries its dynamic metadata: the domain, the
/// descriptors' entries, and the `metadata` of the limits passed, merged.
#[tokio::test]
async fn metric_and_metadata_keys_load_and_dynamic_metadata_is_the_references() {
    let yaml = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata: {name: service_1}
      - key: subkey1
        value: subvalue1
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota: {name: service_2, tiers: [1, 2.5, true, null]}
";
    let vars = [
        ("RUNTIME_ROOT", "/data"),
        ("RESPONSE_DYNAMIC_METADATA", "t"),
    ];
    let got = translated(&vars);
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_DYNAMIC_METADATA"], "true");
    let options = Options {
        dynamic_metadata: true,
        ..Options::from(ResponseHeaders::Off)
    };
    let served = serve(&[("metadata.yaml", yaml)], options).await;
    for (entries, limit) in [
        (&[("key1", "value1"), ("subkey1", "x")][..], 5),
        (&[("key1", "value1"), ("subkey1", "subvalue1")][..], 10),
        (&[("key2", "y")][..], 20),
    ] {
        let answer = call(&served, &request("test-domain", &[entries])).await;
        let status = &answer.unwrap().statuses[0];
        let got = status.current_limit.as_ref().map(|l| l.requests_per_unit);
        assert_eq!(got, Some(limit), "{entries:?}");
    }
    let both = request(
        "test-domain",
        &[&[("key1", "value1"), ("subkey1", "x")], &[("key2", "y")]],
    );
    let answer = call(&served, &both).await.unwrap();
    let fields = answer.dynamic_metadata.unwrap().fields;
    let text = |v: &Value| match &v.kind {
        Some(Kind::String(s)) => s.clone(),
        other => panic!("not text: {other:?}"),
    };
    let of = |v: &Value| match &v.kind {
        Some(Kind::Struct(s)) => s.fields.clone(),
        other => panic!("not a struct: {other:?}"),
    };
    assert_eq!(text(&fields["domain"]), "test-domain");
    let Some(Kind::List(descriptors)) = &fields["descriptors"].kind else {
        panic!("{fields:?}");
    };
    let Some(Kind::List(entries)) = &of(&descriptors.values[0])["entries"].kind else {
        panic!("{descriptors:?}");
    };
    let entries: Vec<String> = entries.values.iter().map(text).collect();
    assert_eq!(entries, ["key1=value1", "subkey1=x"]);
    let metadata = of(&fields["metadata"]);
    assert_eq!(text(&metadata["name"]), "service_1");
    assert_eq!(
        text(&of(&metadata["service_with_quota"])["name"]),
        "service_2"
    );
}

/// Row 4: a `*` anywhere in a value is any run of characters (envoyproxy/ratelimit's
/// test/config/wildcard.yaml, its cases), and `share_threshold` on such a value gives
/// every matching value one bucket.
#[tokio::test]
async fn a_star_anywhere_in_a_value_matches_as_the_reference_matches_it() {
    let yaml = "
domain: test-domain
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 21}}
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 22}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: path, value: /api*v1, rate_limit: {unit: minute, requests_per_unit: 23}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 24}}
  - key: files
    value: files/*/raw
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let served = serve(&[("wildcard.yaml", yaml)], ResponseHeaders::Off).await;
    let cases: &[(Entries, Option<u32>)] = &[
        (&[("wild", "foo")], Some(20)),
        (&[("wild", "foobar")], Some(20)),
        (&[("wild", "fo")], None),
        (&[("noWild", "foobar")], None),
        (&[("midWild", "barab")], Some(22)),
        (&[("midWild", "barb")], Some(22)),
        (&[("midWild", "barba")], None),
        (&[("multiWild", "fooXbarYbaz")], Some(10)),
        (&[("multiWild", "foobarbaz")], Some(10)),
        (&[("multiWild", "foobazbar")], None),
        (&[("path", "/api/users/v1")], Some(23)),
        (&[("path", "/api/users/v2")], None),
        (&[("nestedWild", "val1"), ("wild", "goose")], Some(24)),
        (&[("nestedWild", "val1"), ("wild", "foo")], None),
    ];
    for (entries, limit) in cases {
        let answer = call(&served, &request("test-domain", &[entries])).await;
        let status = &answer.unwrap().statuses[0];
        let got = status.current_limit.as_ref().map(|l| l.requests_per_unit);
        assert_eq!(got, *limit, "{entries:?}");
    }
    // Values matching the pattern share its bucket of 2 (the third is over); a value that
    // does not match has no limit.
    let values = [
        "files/a/raw",
        "files/b/c/raw",
        "files/d/raw",
        "files/x/raw.txt",
    ];
    let mut got = Vec::new();
    for value in values {
        let answer = call(&served, &request("test-domain", &[&[("files", value)]])).await;
        got.push(answer.unwrap().overall_code);
    }
    assert_eq!(got, [CODE_OK, CODE_OK, CODE_OVER_LIMIT, CODE_OK]);
}

/// Row 5: a limit that `replaces` its own name, or an empty `replaces` entry, is refused
/// (envoyproxy/ratelimit's test/config/replaces_self.yaml and replaces_empty.yaml).
#[test]
fn replacing_itself_or_nothing_is_refused() {
    let limit = |replaces: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, \
             requests_per_unit: 1, name: mine, replaces: [{replaces}]}}\n"
        )
    };
    for (replaces, said) in [
        ("{name: mine}", "k: replaces its own name \"mine\""),
        ("{name: \"\"}", "k: an empty replaces entry"),
    ] {
        let dir = Scratch::new();
        dir.write("d.yaml", limit(replaces));
        let refused = Rls::load(dir.path().to_owned(), "rl", ResponseHeaders::Off).err();
        let refused = refused.unwrap_or_else(|| panic!("{replaces} loaded"));
        assert!(refused.contains(said), "{refused}");
    }
    let dir = Scratch::new();
    dir.write("d.yaml", limit("{name: other}"));
    Rls::load(dir.path().to_owned(), "rl", ResponseHeaders::Off).unwrap();
}

/// Row 6: a descriptor's `hits_addend: 0` at exactly the limit is OK with 0 remaining (the
/// reference's counter at its limit), so "check with 0, charge at the stream's end" passes
/// as many requests; only debt makes it over.
#[tokio::test]
async fn an_ask_of_zero_at_exactly_the_limit_is_ok() {
    let served = serve(&[("api.yaml", USERS)], ResponseHeaders::Off).await;
    let costing = |hits: u64| {
        let mut ask = request("api", &[&[("user", "zoe")]]);
        ask.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        ask
    };
    let mut got = Vec::new();
    for hits in [0, 1, 0, 2, 0, 3, 0] {
        let answer = call(&served, &costing(hits)).await.unwrap();
        got.push((
            hits,
            answer.overall_code,
            answer.statuses[0].limit_remaining,
        ));
    }
    let expected = [
        (0, CODE_OK, 3),
        (1, CODE_OK, 2),
        (0, CODE_OK, 2),
        (2, CODE_OK, 0),
        (0, CODE_OK, 0),
        (3, CODE_OVER_LIMIT, 0),
        (0, CODE_OVER_LIMIT, 0),
    ];
    assert_eq!(got, expected);
}

/// Row 7: the same descriptor twice in one call: each status says the level after its own
/// hits (envoyproxy/ratelimit's 9 then 8 of 10), where both said the last.
#[tokio::test]
async fn the_same_descriptor_twice_reports_the_level_after_each() {
    let teams = "
domain: api
descriptors:
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    let served = serve(&[("api.yaml", teams)], ResponseHeaders::Off).await;
    let twice = request("api", &[&[("team", "t")], &[("team", "t")]]);
    let left = |answer: &RateLimitResponse| -> Vec<u32> {
        answer.statuses.iter().map(|s| s.limit_remaining).collect()
    };
    assert_eq!(left(&call(&served, &twice).await.unwrap()), [9, 8]);
    let thrice = request("api", &[&[("team", "t")], &[("x", "y")], &[("team", "t")]]);
    let answer = call(&served, &thrice).await.unwrap();
    assert_eq!(left(&answer), [7, 0, 6]);
}

/// Row 8: an empty descriptor list is an error, as envoyproxy/ratelimit's ("rate limit
/// descriptor list must not be empty"); an entry with an empty key is answered (no
/// configured key is empty, so it finds no limit); more than 32 descriptors are answered,
/// as long as no more than 32 distinct buckets of one kind are in the check.
#[tokio::test]
async fn request_validation_is_the_references() {
    let served = serve(&[("api.yaml", USERS)], ResponseHeaders::Off).await;
    let refused = call(&served, &request("api", &[])).await.unwrap_err();
    assert!(
        refused.contains("descriptor list must not be empty"),
        "{refused}"
    );
    let empty_key = request("api", &[&[("", "x")], &[("user", "amy")]]);
    let answer = call(&served, &empty_key).await.unwrap();
    assert_eq!(answer.overall_code, CODE_OK);
    assert_eq!(answer.statuses[0].current_limit, None);
    assert_eq!(answer.statuses[1].limit_remaining, 2);
    // 40 descriptors: 38 without a limit, and one user's twice (3 of 3).
    let mut many: Vec<Entries> = vec![&[("other", "v")]; 38];
    many.extend([&[("user", "bo")][..], &[("user", "bo")][..]]);
    let answer = call(&served, &request("api", &many)).await.unwrap();
    assert_eq!(answer.statuses.len(), 40);
    let left: Vec<u32> = answer.statuses[38..]
        .iter()
        .map(|s| s.limit_remaining)
        .collect();
    assert_eq!((answer.overall_code, left), (CODE_OK, vec![2, 1]));
}

/// Row 9: started without a configuration that loads, the service keeps serving and fails
/// each call as envoyproxy/ratelimit does ("no rate limit configuration loaded"), so
/// Envoy's `failure_mode_deny` decides, until a change to the files loads one.
#[tokio::test]
async fn without_a_loadable_configuration_each_call_fails_until_one_loads() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let file = dir.write(
        "api.yaml",
        "domain: api\ndescriptors: [{key: user, unknown: 1}]\n",
    );
    let rls = Arc::new(Rls::load_or_wait(
        dir.path().to_owned(),
        "rl",
        ResponseHeaders::Off,
    ));
    let watching = Some(tokio::spawn(Arc::clone(&rls).watch()));
    let mut config = without_token(RELAXED);
    config.rls = Some(rls);
    let served = Served {
        bridge: start_with(&valkey.url(), config).await,
        dir,
        valkey: Some(valkey),
        watching,
    };
    let alice = request("api", &[&[("user", "alice")]]);
    let failed = call(&served, &alice).await.unwrap_err();
    assert!(
        failed.contains("no rate limit configuration loaded"),
        "{failed}"
    );
    std::fs::write(&file, USERS).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = loop {
        match call(&served, &alice).await {
            Ok(answer) => break answer,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("never loaded: {e}"),
        }
    };
    assert_eq!(answer.statuses[0].limit_remaining, 2);
}
