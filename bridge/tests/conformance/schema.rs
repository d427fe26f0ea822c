//! The cases of tests/conformance/*.yaml as data, and the requests and statuses they
//! write, for rls_conformance.rs.

use ratelimit_bridge::doors::rls::answer::{Headers, ResponseHeaders};
use ratelimit_bridge::doors::rls::proto::{
    DescriptorStatus, Entry, Kind, LimitOverride, RateLimitDescriptor, RateLimitRequest, Struct,
    UInt64Value, Value,
};
use ratelimit_bridge::doors::rls::Options;
use serde::Deserialize;
use serde_yaml_ng::Value as Yaml;
use std::collections::BTreeMap;

/// One file of cases: the reference tests of one area.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Area {
    /// The reference's test file(s) these cases port.
    pub source: String,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// The reference test it ports (function, subtest).
    pub reference: String,
    /// The domain of every call that names none.
    #[serde(default)]
    pub domain: String,
    /// One configuration file, or several (`files`, by name).
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub options: Settings,
    /// The configuration is refused, with an error containing this text.
    #[serde(default)]
    pub refused: Option<String>,
    /// The docs' "What differs" entry that makes the case expect another answer.
    #[serde(default)]
    pub differs: Option<String>,
    /// A known mismatch: the case must fail until it is fixed.
    #[serde(default)]
    pub pending: Option<String>,
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Lines `/metrics` must hold after the steps.
    #[serde(default)]
    pub metrics: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub shadow: bool,
    #[serde(default)]
    pub merge: bool,
    #[serde(default)]
    pub dynamic_metadata: bool,
    /// `off` (the default here, as theirs), `reference` or `draft03`.
    #[serde(default)]
    pub headers: Option<String>,
    /// Renamed `reference` headers: limit, remaining, reset.
    #[serde(default)]
    pub header_names: Option<(String, String, String)>,
    /// The files are read again on a change (`write`, `remove` steps).
    #[serde(default)]
    pub watch: bool,
    /// No Redis answers: the bridge is pointed at a closed port.
    #[serde(default)]
    pub redis_down: bool,
}

/// A call (`repeat` times, the answer to the last one checked), or a change to the files.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The case's domain when not given.
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub descriptors: Vec<Descriptor>,
    #[serde(default)]
    pub hits_addend: u32,
    #[serde(default)]
    pub repeat: Option<u32>,
    #[serde(default)]
    pub expect: Option<Expect>,
    #[serde(default)]
    pub differs: Option<String>,
    /// What the reference answers instead, where the step `differs`.
    #[serde(default, rename = "theirs")]
    pub _theirs: Option<String>,
    #[serde(default)]
    pub write: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
    /// After a change to the files, how long to let the bridge read them.
    #[serde(default)]
    pub wait_ms: u64,
}

/// Entries as `[[key, value], ...]`, or with the descriptor's own hits and limit override.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Descriptor {
    Entries(Vec<(String, String)>),
    Full {
        entries: Vec<(String, String)>,
        #[serde(default)]
        hits_addend: Option<u64>,
        /// `requests_per_unit/UNIT`.
        #[serde(default)]
        limit: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub code: Option<String>,
    /// Each `CODE [rpu/UNIT[(name)] [remaining]]`; `-` for no limit; a missing limit is `-`,
    /// a missing remaining 0.
    #[serde(default)]
    pub statuses: Option<Vec<String>>,
    /// `[name, value]`, `*` for any value.
    #[serde(default)]
    pub headers: Option<Vec<(String, String)>>,
    #[serde(default)]
    pub metadata: Option<Yaml>,
    /// The call fails, its gRPC message containing this text.
    #[serde(default)]
    pub error: Option<String>,
}

pub const UNITS: [&str; 8] = [
    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
];
pub const CODES: [&str; 3] = ["UNKNOWN", "OK", "OVER_LIMIT"];

pub fn options(s: &Settings) -> Options {
    let kind = match s.headers.as_deref().unwrap_or("off") {
        "off" => ResponseHeaders::Off,
        "reference" => ResponseHeaders::Reference,
        "draft03" => ResponseHeaders::Draft03,
        other => panic!("headers: {other}"),
    };
    let mut headers = Headers::from(kind);
    if let Some((limit, remaining, reset)) = s.header_names.clone() {
        headers = Headers {
            kind,
            limit,
            remaining,
            reset,
        };
    }
    Options {
        shadow: s.shadow,
        merge: s.merge,
        dynamic_metadata: s.dynamic_metadata,
        ..Options::from(headers)
    }
}

pub fn request(step: &Step, domain: &str) -> RateLimitRequest {
    let entries = |e: &[(String, String)]| -> Vec<Entry> {
        let entry = |(key, value): &(String, String)| Entry {
            key: key.clone(),
            value: value.clone(),
        };
        e.iter().map(entry).collect()
    };
    let descriptor = |d: &Descriptor| match d {
        Descriptor::Entries(e) => RateLimitDescriptor {
            entries: entries(e),
            ..RateLimitDescriptor::default()
        },
        Descriptor::Full {
            entries: e,
            hits_addend,
            limit,
        } => RateLimitDescriptor {
            entries: entries(e),
            hits_addend: hits_addend.map(|value| UInt64Value { value }),
            limit: limit.as_deref().map(|l| {
                let (rpu, unit) = l.split_once('/').expect("limit: rpu/UNIT");
                LimitOverride {
                    requests_per_unit: rpu.parse().unwrap(),
                    unit: UNITS.iter().position(|u| *u == unit).expect(unit) as i32,
                }
            }),
        },
    };
    RateLimitRequest {
        domain: step.domain.clone().unwrap_or_else(|| domain.to_owned()),
        descriptors: step.descriptors.iter().map(descriptor).collect(),
        hits_addend: step.hits_addend,
    }
}

/// A status as the cases write it: `CODE LIMIT REMAINING`.
pub fn status(s: &DescriptorStatus) -> String {
    let code = CODES.get(s.code as usize).unwrap_or(&"?");
    let limit = s.current_limit.as_ref().map_or("-".to_owned(), |l| {
        let unit = UNITS.get(l.unit as usize).unwrap_or(&"?");
        let name = if l.name.is_empty() {
            String::new()
        } else {
            format!("({})", l.name)
        };
        format!("{}/{unit}{name}", l.requests_per_unit)
    });
    format!("{code} {limit} {}", s.limit_remaining)
}

pub fn normal(expected: &str) -> String {
    let mut parts: Vec<&str> = expected.split_whitespace().collect();
    parts.resize(2, "-");
    if expected.split_whitespace().count() < 3 {
        parts.push("0");
    } else {
        parts.push(expected.split_whitespace().nth(2).unwrap());
    }
    parts.join(" ")
}

fn yaml(v: &Value) -> Yaml {
    match &v.kind {
        None | Some(Kind::Null(_)) => Yaml::Null,
        Some(Kind::Number(n)) => Yaml::from(*n),
        Some(Kind::String(s)) => Yaml::String(s.clone()),
        Some(Kind::Bool(b)) => Yaml::Bool(*b),
        Some(Kind::Struct(s)) => structure(s),
        Some(Kind::List(l)) => Yaml::Sequence(l.values.iter().map(yaml).collect()),
    }
}

pub fn structure(s: &Struct) -> Yaml {
    let fields = s
        .fields
        .iter()
        .map(|(k, v)| (Yaml::String(k.clone()), yaml(v)));
    Yaml::Mapping(fields.collect())
}
