//! Holds a metered response's charge (`Metering`, the filter's decision once the response
//! ends) to a strict reading of the same bytes (`serde_json`, events framed by the WHATWG
//! rules or AWS's event stream, both written out here): whatever the bytes, however they
//! are cut into pieces, ended or cut short, plain or under a content coding, for a meter
//! of dotted paths or of any usage format, a client is charged at least what a strict
//! parser reads as its usage, or the rule's max; a response cut short (before a stream's
//! `[DONE]`) or compressed is charged at least the max; and nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_config::config::Config;
use ratelimit_config::loading::{load, Build};
use ratelimit_config::meter::MeterPolicy;
use ratelimit_filter::decision::metered::Metering;
use ratelimit_filter::host::SharedData;
use ratelimit_filter::metering::MAX_COUNT;
use ratelimit_filter::request::rules::PlannedRule;
use ratelimit_filter::wire::RuleResult;
use serde_json::Value;
use std::sync::OnceLock;

const MAX: u64 = 1_000;
/// The meters, chosen by the input's third byte: dotted paths (prompt tokens x1,
/// completion tokens x4), then each usage format, its parts weighed apart.
const METERS: [&str; 6] = [
    r#""body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 4}"#,
    r#""usage": "openai-chat", "weights": {"output": 4, "cached_input": 0, "reasoning": 9}"#,
    r#""usage": "openai-responses", "weights": {"output": 4, "cached_input": 0}"#,
    r#""usage": "anthropic", "weights": {"output": 5, "cached_input": 0, "cache_write": 2}"#,
    r#""usage": "gemini", "weights": {"output": 4, "cached_input": 0, "reasoning": 7}"#,
    r#""usage": "bedrock-converse", "weights": {"output": 5, "cache_write": 3}"#,
];

fn config(meter: usize) -> &'static Config {
    static CONFIGS: OnceLock<Vec<Config>> = OnceLock::new();
    let configs = CONFIGS.get_or_init(|| {
        (METERS.iter())
            .map(|meter| {
                let json = format!(
                    r#"{{"backend": {{"cluster": "b"}},
                    "identity": {{"key": {{"header": "x-api-key"}}}},
                    "rules": [{{"name": "tokens", "key": ["key"],
                       "limit": {{"requests": 1000000, "per": "1h"}},
                       "meter": {{{meter}, "reserve": {{"body": ["max_tokens"], "default": 100,
                                  "max": 1000}}}}}}]}}"#
                );
                match load(json.as_bytes(), Build::Bridge) {
                    Ok(config) => config,
                    Err(e) => panic!("the target's configuration {meter}: {e}"),
                }
            })
            .collect()
    });
    &configs[meter % configs.len()]
}

fn meter_of(config: &Config) -> &MeterPolicy {
    match config.rules[0].meter.as_ref() {
        Some(meter) => meter,
        None => panic!("the target's rule is metered"),
    }
}

/// No local buckets are ever touched: the check was the bridge's.
struct Untouched;

impl SharedData for Untouched {
    fn get(&self, _: &str) -> Option<(Vec<u8>, u32)> {
        panic!("a bridge-admitted settlement read local buckets")
    }
    fn set(&self, _: &str, _: &[u8], _: u32) -> bool {
        panic!("a bridge-admitted settlement wrote local buckets")
    }
}

/// How a response carries its JSON.
#[derive(Clone, Copy, PartialEq)]
enum Body {
    Json,
    Events,
    Aws,
}

/// What the settlement charges in all, for a reservation of `reserved`.
fn charged(
    config: &Config,
    (body, gzip, ended): (Body, bool, bool),
    pieces: &[&[u8]],
    reserved: u64,
) -> u64 {
    let plan = [PlannedRule {
        rule: 0,
        key: "rl:tokens:k".into(),
        limit: config.rules[0].limit,
        cost: reserved,
        lease: 0,
        block: None,
        shadow: false,
        slot: None,
    }];
    let took = RuleResult {
        allowed: true,
        ..RuleResult::default()
    };
    let Some(mut m) = Metering::reserved(config, &plan, &[took]) else {
        panic!("a metered rule reserves");
    };
    let content_type: &[u8] = match body {
        Body::Json => b"application/json",
        Body::Events => b"text/event-stream",
        Body::Aws => b"application/vnd.amazon.eventstream",
    };
    m.response_headers(config, |name| match name {
        ":status" => Some(b"200".to_vec()),
        "content-type" => Some(content_type.to_vec()),
        "content-encoding" if gzip => Some(b"gzip".to_vec()),
        _ => None,
    });
    for piece in pieces {
        m.body(piece);
    }
    if ended {
        m.ended();
    }
    let settlement = m.settle(config, "f-1", &Untouched, 0);
    let delta = settlement.line.as_deref().map_or(0, |line| {
        let fields: Vec<&str> = line.trim_end().split(',').collect();
        match fields[fields.len() - 2].parse::<i64>() {
            Ok(delta) => delta,
            Err(e) => panic!("a settlement's delta in {line:?}: {e}"),
        }
    });
    match u64::try_from(i128::from(reserved) + i128::from(delta)) {
        Ok(charge) => charge,
        Err(_) => panic!("a charge below 0: {reserved} reserved, {delta} settled"),
    }
}

/// The counts at `paths` in a JSON value, as a strict reader reads them (counts below
/// `MAX_COUNT` only), over those of earlier values.
fn counts_in(value: &Value, paths: &[Vec<String>], last: &mut [Option<u64>]) {
    for (slot, path) in last.iter_mut().zip(paths) {
        let pointer: String = (path.iter())
            .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
            .collect();
        if let Some(n) = value.pointer(&pointer).and_then(Value::as_u64) {
            if n < MAX_COUNT {
                *slot = Some(n);
            }
        }
    }
}

/// The events' data, framed as the WHATWG's server-sent events: lines end at CR LF, LF or
/// CR; a `data` field's value (one leading space dropped) is appended with a LF; a blank
/// line ends the event; a byte order mark at the start is skipped.
fn events(body: &[u8]) -> Vec<Vec<u8>> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let (mut out, mut data, mut line) = (Vec::new(), Vec::<u8>::new(), Vec::new());
    let mut i = 0;
    while i <= body.len() {
        let b = body.get(i).copied();
        match b {
            Some(b'\r') | Some(b'\n') | None => {
                if b.is_none() {
                    break; // an event not ended by a blank line is never dispatched
                }
                if b == Some(b'\r') && body.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                if line.is_empty() {
                    if !data.is_empty() {
                        data.pop();
                        out.push(std::mem::take(&mut data));
                    }
                } else {
                    let (name, value) = match line.iter().position(|&c| c == b':') {
                        Some(at) => (&line[..at], &line[at + 1..]),
                        None => (&line[..], &b""[..]),
                    };
                    if name == b"data" {
                        data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
                        data.push(b'\n');
                    }
                    line.clear();
                }
            }
            Some(c) => line.push(c),
        }
        i += 1;
    }
    out
}

/// The payloads of AWS's event stream, as an SDK reads them: each message's prelude CRC
/// and message CRC checked, reading stopped at the first that fails or does not fit.
fn aws_payloads(mut body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    while body.len() >= 16 {
        let (total, headers) = (be(&body[..4]) as usize, be(&body[4..8]) as usize);
        if crc32fast::hash(&body[..8]) != be(&body[8..12])
            || total < 16
            || total > body.len()
            || headers > total - 16
            || crc32fast::hash(&body[..total - 4]) != be(&body[total - 4..total])
        {
            break;
        }
        out.push(body[12 + headers..total - 4].to_vec());
        body = &body[total..];
    }
    out
}

/// The cost a strict reader reads in `body` for `meter` (the last count at each path,
/// over every event or message of a stream, costed as the meter costs counts), if it reads
/// one.
fn reference(meter: &MeterPolicy, format: Body, body: &[u8]) -> Option<u64> {
    let paths = meter.paths();
    let mut last = vec![None; paths.len()];
    let values = match format {
        Body::Json => {
            serde_json::from_slice::<Value>(body).ok()?;
            vec![body.to_vec()]
        }
        Body::Events => events(body),
        Body::Aws => aws_payloads(body),
    };
    for data in values {
        if let Ok(value) = serde_json::from_slice::<Value>(&data) {
            counts_in(&value, &paths, &mut last);
        }
    }
    meter.cost_of(&last)
}

// The first byte: a stream (bit 0), ended (bit 1), a gzip coding (bit 2), the pieces'
// size (the rest); the second, the reservation's share of the max; the third, the meter
// (its high bit: a stream in AWS's framing, not server-sent events).
fuzz_target!(|data: &[u8]| {
    let [control, share, meter, body @ ..] = data else {
        return;
    };
    let config = config(usize::from(meter & 0x7f));
    let (stream, ended, gzip) = (control & 1 == 1, control & 2 == 2, control & 4 == 4);
    let format = match (stream, meter & 0x80 != 0) {
        (false, _) => Body::Json,
        (true, false) => Body::Events,
        (true, true) => Body::Aws,
    };
    let reserved = (u64::from(*share) * MAX / 255).max(1);
    let size = usize::from(control >> 3) + 1;
    let pieces: Vec<&[u8]> = body.chunks(size).collect();
    let how = (format, gzip, ended);
    let charge = charged(config, how, &pieces, reserved);
    assert_eq!(
        charge,
        charged(config, how, &[body], reserved),
        "in pieces of {size} as whole"
    );
    // A stream that said it was done (an event whose data is `[DONE]`, OpenAI's last) has
    // reported all it will: cut after it, it is charged as ended.
    let done = matches!(format, Body::Events) && events(body).iter().any(|e| e == b"[DONE]");
    if (!ended && !done) || gzip {
        assert!(charge >= MAX, "cut short or compressed: {charge}");
    }
    if let Some(cost) = reference(meter_of(config), format, body) {
        assert!(
            charge >= cost.min(MAX),
            "charged {charge} where a strict reader reads {cost}"
        );
    }
});
