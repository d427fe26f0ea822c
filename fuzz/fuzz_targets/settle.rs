//! Holds a metered response's charge (`Metering`, the filter's decision once the response
//! ends) to a strict reading of the same bytes (`serde_json`, events framed by the WHATWG
//! rules written out here): whatever the bytes, however they are cut into pieces, ended
//! or cut short, plain or under a content coding, for a meter of dotted paths or of any
//! usage format, a client is charged at least what a strict parser reads as its usage, or
//! the rule's max; a response cut short or compressed is charged at least the max; and
//! nothing panics.
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

/// What the settlement charges in all, for a reservation of `reserved`.
fn charged(
    config: &Config,
    (stream, gzip, ended): (bool, bool, bool),
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
    }];
    let took = RuleResult {
        allowed: true,
        ..RuleResult::default()
    };
    let Some(mut m) = Metering::reserved(config, &plan, &[took]) else {
        panic!("a metered rule reserves");
    };
    let content_type: &[u8] = if stream {
        b"text/event-stream"
    } else {
        b"application/json"
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

/// The cost a strict reader reads in `body` for `meter` (the last count at each path,
/// over every event of a stream, costed as the meter costs counts), if it reads one.
fn reference(meter: &MeterPolicy, stream: bool, body: &[u8]) -> Option<u64> {
    let paths = meter.paths();
    let mut last = vec![None; paths.len()];
    if stream {
        for data in events(body) {
            if let Ok(value) = serde_json::from_slice::<Value>(&data) {
                counts_in(&value, &paths, &mut last);
            }
        }
    } else {
        counts_in(
            &serde_json::from_slice::<Value>(body).ok()?,
            &paths,
            &mut last,
        );
    }
    meter.cost_of(&last)
}

// The first byte: the format (bit 0), ended (bit 1), a gzip coding (bit 2), the pieces'
// size (the rest); the second, the reservation's share of the max; the third, the meter.
fuzz_target!(|data: &[u8]| {
    let [control, share, meter, body @ ..] = data else {
        return;
    };
    let config = config(usize::from(*meter));
    let (stream, ended, gzip) = (control & 1 == 1, control & 2 == 2, control & 4 == 4);
    let reserved = (u64::from(*share) * MAX / 255).max(1);
    let size = usize::from(control >> 3) + 1;
    let pieces: Vec<&[u8]> = body.chunks(size).collect();
    let how = (stream, gzip, ended);
    let charge = charged(config, how, &pieces, reserved);
    assert_eq!(
        charge,
        charged(config, how, &[body], reserved),
        "in pieces of {size} as whole"
    );
    if !ended || gzip {
        assert!(charge >= MAX, "cut short or compressed: {charge}");
    }
    if let Some(cost) = reference(meter_of(config), stream, body) {
        assert!(
            charge >= cost.min(MAX),
            "charged {charge} where a strict reader reads {cost}"
        );
    }
});
