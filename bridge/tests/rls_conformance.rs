//! envoyproxy/ratelimit's own test suite, its behaviour ported as data: every case of
//! `tests/conformance/*.yaml` (one file per reference test area) run against the bridge in
//! process with a real Valkey, called over h2c as Envoy calls it.
//!
//! A case expects the reference's answer, unless it names (`differs`) an entry of
//! docs/rate-limit-service.md's "What differs from envoyproxy/ratelimit" section, which the
//! runner checks is there. A case marked `pending` is a known mismatch still to fix: it must
//! fail (and says so), so the mark goes when the fix lands.

#[path = "conformance/schema.rs"]
mod schema;

use crate::common::client::{h2c, req};
use crate::common::rls::{call, serve_watching, Served};
use crate::common::{Connect, Valkey};
use hyper::Method;
use ratelimit_bridge::doors::rls::proto::RateLimitResponse;
use schema::{normal, options, request, status, structure, Area, Case, Expect, CODES};
use serde_yaml_ng::Value as Yaml;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where `answer` is not what `expect` says.
fn judge(expect: &Expect, answer: &Result<RateLimitResponse, String>) -> Result<(), String> {
    let answer = match (answer, &expect.error) {
        (Err(e), Some(said)) if e.contains(said.as_str()) => return Ok(()),
        (Err(e), _) => return Err(format!("failed: {e}")),
        (Ok(a), Some(said)) => return Err(format!("answered {a:?}, expected error {said}")),
        (Ok(a), None) => a,
    };
    let mut wrong = Vec::new();
    if let Some(code) = &expect.code {
        let got = CODES.get(answer.overall_code as usize).unwrap_or(&"?");
        if got != code {
            wrong.push(format!("overall {got}, expected {code}"));
        }
    }
    if let Some(statuses) = &expect.statuses {
        let got: Vec<String> = answer.statuses.iter().map(status).collect();
        let want: Vec<String> = statuses.iter().map(|s| normal(s)).collect();
        if got != want {
            wrong.push(format!("statuses {got:?}, expected {want:?}"));
        }
    }
    if let Some(headers) = &expect.headers {
        let got: Vec<(String, String)> = answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        let fits = got.len() == headers.len()
            && got
                .iter()
                .zip(headers)
                .all(|((k, v), (ek, ev))| k == ek && (ev == "*" || v == ev));
        if !fits {
            wrong.push(format!("headers {got:?}, expected {headers:?}"));
        }
    }
    if let Some(metadata) = &expect.metadata {
        let got = answer
            .dynamic_metadata
            .as_ref()
            .map_or(Yaml::Null, structure);
        if &got != metadata {
            wrong.push(format!("metadata {got:?}, expected {metadata:?}"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Runs `case`: `Err` says where the bridge's answers differ from the case's.
async fn run(case: &Case, valkey: &Valkey) -> Result<(), String> {
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut valkey.connection())
        .unwrap();
    let mut files: Vec<(&str, &str)> = case
        .files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some(config) = &case.config {
        files.push(("config.yaml", config));
    }
    let url = match case.options.redis_down {
        true => "redis://127.0.0.1:1".to_owned(),
        false => valkey.url(),
    };
    let loaded = serve_watching(&url, &files, options(&case.options), case.options.watch).await;
    let served: Served = match (loaded, &case.refused) {
        (Err(e), Some(said)) if e.contains(said.as_str()) => return Ok(()),
        (Err(e), _) => return Err(format!("refused: {e}")),
        (Ok(_), Some(said)) => return Err(format!("loaded, expected refused: {said}")),
        (Ok(served), None) => served,
    };
    let mut settling = false;
    for (i, step) in case.steps.iter().enumerate() {
        if !step.write.is_empty() || !step.remove.is_empty() {
            for (name, text) in &step.write {
                served.dir.write(name, text);
            }
            for name in &step.remove {
                std::fs::remove_file(served.dir.path().join(name)).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(step.wait_ms)).await;
            settling = step.wait_ms == 0;
            continue;
        }
        let request = request(step, &case.domain);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut answer = call(&served, &request).await;
            for _ in 1..step.repeat.unwrap_or(1) {
                answer = call(&served, &request).await;
            }
            let Some(expect) = &step.expect else { break };
            match judge(expect, &answer) {
                Ok(()) => break,
                Err(_) if settling && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(format!("step {}: {e}", i + 1)),
            }
        }
        settling = false;
    }
    if !case.metrics.is_empty() {
        let scraped = h2c(served.bridge.addr, req(Method::GET, "/metrics", ""))
            .await
            .1;
        for line in &case.metrics {
            if !scraped.contains(line.as_str()) {
                let series = line.rsplit_once(' ').map_or(line.as_str(), |(s, _)| s);
                let got = scraped.lines().find(|l| l.starts_with(series));
                return Err(format!("/metrics has no {line} ({got:?})"));
            }
        }
    }
    Ok(())
}

/// The docs' "What differs from envoyproxy/ratelimit" section.
fn what_differs() -> String {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/rate-limit-service.md");
    let docs = std::fs::read_to_string(docs).unwrap();
    let start = docs
        .find("### What differs from envoyproxy/ratelimit")
        .unwrap();
    let rest = &docs[start..];
    let end = rest[4..].find("\n## ").map_or(rest.len(), |e| e + 4);
    rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn the_reference_suite_as_data() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    let differs = what_differs();
    let valkey = Valkey::start();
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    for path in paths {
        let area_name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let area: Area =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!area.source.is_empty());
        let (mut same, mut documented, mut pending) = (0, 0, 0);
        for case in &area.cases {
            let label = format!("{area_name}: {} ({})", case.name, case.reference);
            let claims = case
                .differs
                .iter()
                .chain(case.steps.iter().flat_map(|s| &s.differs));
            for claim in claims {
                let claim = claim.split_whitespace().collect::<Vec<_>>().join(" ");
                if !differs.contains(&claim) {
                    failures.push(format!("{label}: differs {claim:?}, not in the docs"));
                }
            }
            let differing =
                case.differs.is_some() || case.steps.iter().any(|s| s.differs.is_some());
            let began = Instant::now();
            let outcome = run(case, &valkey).await;
            if began.elapsed() > Duration::from_secs(1) {
                eprintln!("SLOW {label}: {:?}", began.elapsed());
            }
            match (outcome, &case.pending) {
                (Ok(()), None) if differing => documented += 1,
                (Ok(()), None) => same += 1,
                (Err(e), Some(why)) => {
                    pending += 1;
                    eprintln!("PENDING {label} [{why}]: {e}");
                }
                (Ok(()), Some(why)) => {
                    failures.push(format!("{label}: passes now, drop `pending: {why}`"));
                }
                (Err(e), None) => failures.push(format!("{label}: {e}")),
            }
        }
        report.push(format!(
            "{area_name} ({}): {} cases, {same} as the reference, {documented} as documented \
             in What differs, {pending} pending",
            area.source,
            area.cases.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
