//! The metering class closed (issue 38): whatever an upstream served and however it
//! reached the filter, a client is charged at least what the upstream consumed, or the
//! rule's max. Responses are drawn as OpenAI's API writes them (a JSON body, or a stream
//! with or without its usage event), then spoiled the ways the attacker's review found: a
//! compressed coding, events reordered, a usage key repeated, cut at any point by either
//! side, fed in pieces of any size. The reference is what the upstream consumed; the
//! charge is what the settlement takes, read back from its line.

use super::*;
use crate::fakes::{check, FakeShared};
use proptest::prelude::*;
use ratelimit_config::loading::{load, Build};

const BURST: u64 = 1_000_000;
const MAX: u64 = 1_000;

/// Prompt tokens x1, completion x4, a reservation of 100 (at most 1,000) from the body.
fn config() -> Config {
    let json = r#"{"backend": {"cluster": "b"},
        "identity": {"key": {"header": "x-api-key"}},
        "rules": [{"name": "tokens", "key": ["key"],
                   "limit": {"requests": 1000000, "per": "1h"},
                   "meter": {"body": {"usage.prompt_tokens": 1, "usage.completion_tokens": 4},
                             "reserve": {"body": ["max_tokens"], "default": 100, "max": 1000}}}]}"#;
    load(json.as_bytes(), Build::Bridge).unwrap()
}

/// How a served response reached the filter.
#[derive(Debug, Clone)]
struct Served {
    prompt: u64,
    completion: u64,
    /// A stream (else one JSON body); with its usage event (as asked for).
    stream: bool,
    usage_event: bool,
    /// The usage event comes before the content events rather than after them.
    usage_first: bool,
    /// `content-encoding: gzip` (the bytes left plain: the meter must not read them).
    gzip: bool,
    /// The usage object gives `prompt_tokens` twice, the other value first or last.
    repeated: Option<(u64, bool)>,
    /// The body stops after this share (per mille) of its bytes, the end never seen.
    cut: Option<u16>,
    /// Sizes of the pieces it arrives in.
    pieces: Vec<usize>,
    reserved: u64,
}

impl Served {
    fn consumed(&self) -> u64 {
        self.prompt + 4 * self.completion
    }

    fn usage(&self) -> String {
        let prompt = match self.repeated {
            Some((other, true)) => format!(
                r#""prompt_tokens": {other}, "prompt_tokens": {}"#,
                self.prompt
            ),
            Some((other, false)) => format!(
                r#""prompt_tokens": {}, "prompt_tokens": {other}"#,
                self.prompt
            ),
            None => format!(r#""prompt_tokens": {}"#, self.prompt),
        };
        format!(
            r#"{{{prompt}, "completion_tokens": {}, "total_tokens": {}}}"#,
            self.completion,
            self.prompt + self.completion
        )
    }

    fn body(&self) -> Vec<u8> {
        if !self.stream {
            return format!(
                r#"{{"id": "c", "object": "chat.completion", "choices": [{{"index": 0, "message": {{"role": "assistant", "content": "a b c"}}}}], "usage": {}}}"#,
                self.usage()
            )
            .into_bytes();
        }
        let content: Vec<String> = (0..3)
            .map(|i| {
                format!(
                    r#"data: {{"choices": [{{"delta": {{"content": "t{i}"}}}}], "usage": null}}"#
                )
            })
            .collect();
        let usage = format!(r#"data: {{"choices": [], "usage": {}}}"#, self.usage());
        let mut events = content;
        match (self.usage_event, self.usage_first) {
            (true, true) => events.insert(0, usage),
            (true, false) => events.push(usage),
            _ => {}
        }
        events.push("data: [DONE]".into());
        events
            .iter()
            .map(|e| format!("{e}\n\n"))
            .collect::<String>()
            .into_bytes()
    }

    /// Whether the meter can read this response in full.
    fn readable(&self) -> bool {
        !self.gzip
            && self.repeated.is_none()
            && self.cut.is_none()
            && (!self.stream || self.usage_event)
    }
}

fn served() -> impl Strategy<Value = Served> {
    (
        (
            0..20_000u64,
            0..5_000u64,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            prop::bool::weighted(0.2),
            prop::option::weighted(0.2, (0..20_000u64, any::<bool>())),
            prop::option::weighted(0.3, 0..1000u16),
            prop::collection::vec(1..64usize, 1..8),
            1..=MAX,
        ),
    )
        .prop_map(
            |(
                (prompt, completion, stream, usage_event, usage_first),
                (gzip, repeated, cut, pieces, reserved),
            )| Served {
                prompt,
                completion,
                stream,
                usage_event,
                usage_first,
                gzip,
                repeated,
                cut,
                pieces,
                reserved,
            },
        )
}

/// What the settlement of `served` charges, in all.
fn charged(config: &Config, served: &Served) -> (u64, Settlement) {
    let plan = [PlannedRule {
        rule: 0,
        ..crate::fakes::planned("rl:tokens:k", BURST, 1, 1, served.reserved)
    }];
    let took = RuleResult {
        allowed: true,
        ..RuleResult::default()
    };
    let mut m = Metering::reserved(config, &plan, &[took]).unwrap();
    let content_type = if served.stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let encoding = if served.gzip { "gzip" } else { "identity" };
    m.response_headers(config, |name| match name {
        ":status" => Some(b"200".to_vec()),
        "content-type" => Some(content_type.into()),
        "content-encoding" => Some(encoding.into()),
        _ => None,
    });
    let mut body = served.body();
    if let Some(per_mille) = served.cut {
        body.truncate(body.len() * usize::from(per_mille) / 1000);
    }
    let mut rest = &body[..];
    for &size in served.pieces.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (piece, after) = rest.split_at(size.min(rest.len()));
        m.body(piece);
        rest = after;
    }
    if served.cut.is_none() {
        m.ended();
    }
    let settlement = m.settle(config, "p-1", &FakeShared::default(), 0);
    let delta = settlement.line.as_deref().map_or(0, |line| {
        let fields: Vec<&str> = line.trim_end().split(',').collect();
        fields[fields.len() - 2].parse::<i64>().unwrap()
    });
    let charge = u64::try_from(i128::from(served.reserved) + i128::from(delta)).unwrap();
    (charge, settlement)
}

#[test]
fn a_client_is_charged_at_least_what_it_consumed_or_the_max() {
    let config = config();
    check(2_000, served(), |served| {
        let (charge, settlement) = charged(&config, &served);
        let consumed = served.consumed();
        if served.readable() {
            prop_assert_eq!(charge, consumed, "read in full: exact");
            prop_assert_eq!(settlement.unmeasured, 0);
        } else {
            prop_assert!(charge >= MAX, "unread: at least the max, {}", charge);
            prop_assert_eq!(settlement.unmeasured, 1);
        }
        prop_assert!(
            charge >= consumed.min(MAX),
            "{} for {} consumed",
            charge,
            consumed
        );
        Ok(())
    });
}

#[test]
fn what_an_unread_response_showed_is_never_charged_less() {
    // A stream whose usage event came whole, then was cut: at least what it showed.
    let config = config();
    check(
        500,
        (0..50_000u64, 0..20_000u64, 1..=MAX),
        |(prompt, completion, reserved)| {
            let served = Served {
                prompt,
                completion,
                stream: true,
                usage_event: true,
                usage_first: true,
                gzip: false,
                repeated: None,
                cut: Some(999),
                pieces: vec![7],
                reserved,
            };
            let (charge, _) = charged(&config, &served);
            prop_assert_eq!(charge, served.consumed().max(MAX));
            Ok(())
        },
    );
}
