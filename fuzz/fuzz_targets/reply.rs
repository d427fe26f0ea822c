//! Holds `decode_reply` to refusing any reply that does not answer the checks sent, without
//! panicking, and to reading back what `render_reply` writes: results exactly, reasons
//! cleaned (no control characters, at most `MAX_REASON_LEN`) and otherwise as sent.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use ratelimit_fuzz::counts_and_reply;
use ratelimit_protocol::{
    decode_reply, render_reply, CheckResult, RuleResult, MAX_REASON_LEN, MAX_RULES,
};

fuzz_target!(|data: &[u8]| {
    let (counts, reply) = counts_and_reply(data, MAX_RULES);
    if let Ok(results) = decode_reply(reply, &counts) {
        assert_eq!(results.len(), counts.len());
    }
    if let Ok(items) = Unstructured::new(data).arbitrary::<Vec<Item>>() {
        round_trip(&items.into_iter().map(result).collect::<Vec<_>>());
    }
});

/// A check's result: its kind, Redis time, rules and reason, as far as the kind uses them.
type Item = (u8, u64, Vec<(bool, bool, u64, u64, u64)>, String);

fn result((kind, now_ms, rules, reason): Item) -> CheckResult {
    match kind % 3 {
        0 => CheckResult::Checked {
            now_ms,
            rules: rules
                .into_iter()
                .take(MAX_RULES)
                .map(
                    |(allowed, blocked, remaining, full_ms, wait_ms)| RuleResult {
                        allowed,
                        blocked: blocked && !allowed,
                        remaining,
                        full_ms,
                        wait_ms,
                        ..RuleResult::default()
                    },
                )
                .collect(),
        },
        1 => CheckResult::Failed(reason),
        _ => CheckResult::Refused(reason),
    }
}

fn round_trip(sent: &[CheckResult]) {
    let mut body = String::new();
    render_reply(&mut body, sent);
    let counts: Vec<usize> = sent
        .iter()
        .map(|r| match r {
            CheckResult::Checked { rules, .. } => rules.len(),
            _ => 0,
        })
        .collect();
    let got = decode_reply(body.as_bytes(), &counts).unwrap_or_else(|e| panic!("{e:?}: {body}"));
    for (sent, got) in sent.iter().zip(&got) {
        match (sent, got) {
            (CheckResult::Checked { .. }, _) => assert_eq!(sent, got),
            (CheckResult::Failed(why), CheckResult::Failed(got))
            | (CheckResult::Refused(why), CheckResult::Refused(got)) => {
                assert!(got.len() <= MAX_REASON_LEN && !got.chars().any(char::is_control));
                let clean = why.len() <= MAX_REASON_LEN
                    && why.trim() == why
                    && !why.chars().any(char::is_control);
                assert!(!clean || why == got, "{why:?} came back as {got:?}");
            }
            _ => panic!("{sent:?} came back as {got:?}"),
        }
    }
}
