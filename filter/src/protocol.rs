//! The callout wire format (`POST /v1/check`), shared with the bridge.
//!
//! A batch from day one, and cheap to encode and decode in wasm: plain ASCII lines.
//!
//! Request body: one line per check (one check per paused request), each rule of the check
//! as `key,burst,num,den,cost`, rules separated by one space:
//! ```text
//! rl:per-user:alice,100,1,600,1 rl:global,50000,50,1,1
//! ```
//! Reply body: one line per check, in order. A checked line is the Redis time in ms, then
//! per rule `allowed,remaining,full_ms,wait_ms` (`allowed` is 1 or 0; `remaining` whole
//! tokens left; `full_ms` until the bucket is full again; `wait_ms` until the request's cost
//! is available, 0 if it was admitted). A check the bridge could not run is `!` and a reason.
//! ```text
//! 1767225600000 1,99,600,0 1,49999,1,0
//! ! redis unavailable
//! ```
//! A check is all-or-nothing: either every rule was allowed and charged, or none was charged.

use crate::rules::PlannedRule;
use std::fmt::Write;

/// The path of this protocol version on the bridge.
pub const PATH: &str = "/v1/check";

/// Longest reply the filter reads; anything longer is garbage.
pub const MAX_REPLY_LEN: usize = 64 * 1024;

/// Appends one check's line to a request body.
pub fn encode_check(body: &mut String, rules: &[PlannedRule]) {
    for (i, r) in rules.iter().enumerate() {
        if i > 0 {
            body.push(' ');
        }
        let l = &r.limit;
        let _ = write!(body, "{},{},{},{},{}", r.key, l.burst, l.num, l.den, r.cost);
    }
    body.push('\n');
}

/// The outcome of one rule of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleResult {
    pub allowed: bool,
    pub remaining: u64,
    pub full_ms: u64,
    pub wait_ms: u64,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    /// Redis's clock at the check (ms since the epoch) and one result per rule.
    Checked { now_ms: u64, rules: Vec<RuleResult> },
    /// The bridge could not run this check.
    Failed(String),
}

/// Why a reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReply(pub &'static str);

/// Parses a reply that must answer `checks` checks of `rules_per_check[i]` rules each.
pub fn decode_reply(body: &[u8], rules_per_check: &[usize]) -> Result<Vec<CheckResult>, BadReply> {
    if body.len() > MAX_REPLY_LEN {
        return Err(BadReply("reply too long"));
    }
    let text = std::str::from_utf8(body).map_err(|_| BadReply("reply is not UTF-8"))?;
    let mut lines = text.lines();
    let mut results = Vec::with_capacity(rules_per_check.len());
    for &expected in rules_per_check {
        let line = lines.next().ok_or(BadReply("reply has too few lines"))?;
        results.push(decode_line(line, expected)?);
    }
    if lines.next().is_some() {
        return Err(BadReply("reply has too many lines"));
    }
    Ok(results)
}

fn decode_line(line: &str, expected: usize) -> Result<CheckResult, BadReply> {
    if let Some(reason) = line.strip_prefix('!') {
        return Ok(CheckResult::Failed(reason.trim().to_string()));
    }
    let mut fields = line.split(' ');
    let now_ms = number(fields.next())?;
    let mut rules = Vec::with_capacity(expected);
    for field in fields {
        let mut parts = field.split(',');
        let allowed = match parts.next() {
            Some("1") => true,
            Some("0") => false,
            _ => return Err(BadReply("rule result lacks an allowed flag")),
        };
        let result = RuleResult {
            allowed,
            remaining: number(parts.next())?,
            full_ms: number(parts.next())?,
            wait_ms: number(parts.next())?,
        };
        if parts.next().is_some() {
            return Err(BadReply("rule result has extra fields"));
        }
        rules.push(result);
    }
    if rules.len() != expected {
        return Err(BadReply("reply answers a different number of rules"));
    }
    Ok(CheckResult::Checked { now_ms, rules })
}

fn number(field: Option<&str>) -> Result<u64, BadReply> {
    field
        .filter(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|f| f.parse().ok())
        .ok_or(BadReply("malformed number in reply"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn planned(key: &str, burst: u64, num: u64, den: u64, cost: u64) -> PlannedRule {
        let limit = Limit {
            requests: num,
            per_ms: den,
            burst,
            num,
            den,
        };
        PlannedRule {
            rule: 0,
            key: key.into(),
            limit,
            cost,
        }
    }

    #[test]
    fn a_check_encodes_as_one_line_of_rules() {
        let mut body = String::new();
        encode_check(
            &mut body,
            &[
                planned("rl:a:x", 10, 1, 6000, 1),
                planned("rl:g", 5, 50, 1, 2),
            ],
        );
        encode_check(&mut body, &[planned("rl:b", 1, 1, 1, 1)]);
        assert_eq!(body, "rl:a:x,10,1,6000,1 rl:g,5,50,1,2\nrl:b,1,1,1,1\n");
    }

    #[test]
    fn replies_decode_per_check() {
        let body = b"1700000000123 1,9,6000,0 0,0,100,40\n! redis down\n";
        let results = decode_reply(body, &[2, 1]).unwrap();
        assert_eq!(
            results[0],
            CheckResult::Checked {
                now_ms: 1_700_000_000_123,
                rules: vec![
                    RuleResult {
                        allowed: true,
                        remaining: 9,
                        full_ms: 6000,
                        wait_ms: 0
                    },
                    RuleResult {
                        allowed: false,
                        remaining: 0,
                        full_ms: 100,
                        wait_ms: 40
                    },
                ],
            }
        );
        assert_eq!(results[1], CheckResult::Failed("redis down".into()));
    }

    #[test]
    fn garbage_and_truncated_replies_are_refused() {
        let cases: &[&[u8]] = &[
            b"",
            b"1700000000123",
            b"1700000000123 1,9,6000",
            b"1700000000123 1,9,6000,0,7",
            b"1700000000123 2,9,6000,0",
            b"1700000000123 1,-9,6000,0",
            b"1700000000123 1,99999999999999999999999,1,0",
            b"1700000000123 1,9,6000,0 1,9,6000,0",
            b"1700000000123 1,9,6000,0\nextra\n",
            b"<html>502 Bad Gateway</html>",
            b"\xff\xfe 1,9,6000,0",
        ];
        for body in cases {
            assert!(
                decode_reply(body, &[1]).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(decode_reply(&vec![b'1'; MAX_REPLY_LEN + 1], &[1]).is_err());
    }
}
