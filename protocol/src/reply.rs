//! The reply side: the bridge renders one line per check, the filter decodes them
//! strictly, checking that the reply answers exactly the checks and rules it sent.

use crate::bounds::{MAX_REASON_LEN, MAX_REPLY_LEN};
use crate::number::push_u64;

/// The outcome of one rule of a check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleResult {
    pub allowed: bool,
    /// The bucket's client is blocked (`wait_ms`: until the block ends); never allowed.
    pub blocked: bool,
    /// Whole tokens left.
    pub remaining: u64,
    /// Milliseconds until the bucket is full again.
    pub full_ms: u64,
    /// Milliseconds until the request's cost is available; 0 if it was admitted.
    pub wait_ms: u64,
    /// Tokens taken beyond the cost, as a lease the check asked for.
    pub leased: u64,
    /// A settlement's and a read's only: tokens the bucket owes (a metered rule's debt).
    pub owed: u64,
    /// A settlement's only: tokens it took beyond what the bucket held.
    pub borrowed: u64,
    /// The bucket's size in force when the bridge put another limit on the rule than the
    /// gateway sent (the client's plan, an override), for the gateway to show; 0: as sent.
    pub limit: u64,
}

impl RuleResult {
    /// The bucket's size in force: `limit` when the bridge said one, else `sent`, the one
    /// the gateway sent.
    pub fn in_force(&self, sent: u64) -> u64 {
        match self.limit {
            0 => sent,
            limit => limit,
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    /// Redis's clock at the check (ms since the epoch) and one result per rule.
    Checked { now_ms: u64, rules: Vec<RuleResult> },
    /// A settlement applied (or found applied before), with what each bucket holds or
    /// owes now (`remaining`, `owed`, `borrowed`).
    Settled { now_ms: u64, rules: Vec<RuleResult> },
    /// The bridge could not run this check (Redis failed): a backend failure.
    Failed(String),
    /// The bridge would not run this check (a line it cannot read, a key outside its
    /// prefixes): the check's own fault, never the backend's.
    Refused(String),
}

/// Renders one reply line per check, in order. Reasons are cut to `MAX_REASON_LEN` and
/// kept on their line, so the reply always fits `MAX_REPLY_LEN`.
pub fn render_reply(out: &mut String, results: &[CheckResult]) {
    out.reserve(results.len() * 48);
    for result in results {
        match result {
            CheckResult::Checked { now_ms, rules } => {
                push_u64(out, *now_ms);
                for r in rules {
                    out.push_str(match (r.allowed, r.blocked) {
                        (true, _) => " 1",
                        (false, false) => " 0",
                        (false, true) => " b",
                    });
                    for n in [r.remaining, r.full_ms, r.wait_ms] {
                        out.push(',');
                        push_u64(out, n);
                    }
                    if r.leased > 0 {
                        out.push(',');
                        push_u64(out, r.leased);
                    }
                    if r.limit > 0 {
                        out.push(LIMIT_MARK);
                        push_u64(out, r.limit);
                    }
                }
            }
            CheckResult::Settled { now_ms, rules } => {
                push_u64(out, *now_ms);
                for r in rules {
                    out.push_str(" s");
                    for n in [r.remaining, r.owed, r.borrowed] {
                        out.push(',');
                        push_u64(out, n);
                    }
                }
            }
            CheckResult::Failed(reason) | CheckResult::Refused(reason) => {
                out.push_str(if matches!(result, CheckResult::Failed(_)) {
                    "! "
                } else {
                    "? "
                });
                out.extend(
                    reason
                        .chars()
                        .map(|c| if c.is_control() { ' ' } else { c })
                        .scan(0, |len, c| {
                            *len += c.len_utf8();
                            (*len <= MAX_REASON_LEN).then_some(c)
                        }),
                );
            }
        }
        out.push('\n');
    }
}

/// What precedes a rule result's limit in force, when the bridge says it (`/limit`).
const LIMIT_MARK: char = '/';

/// Why a reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReply(pub &'static str);

/// Parses a reply that must answer checks of `rules_per_check[i]` rules each.
pub fn decode_reply(body: &[u8], rules_per_check: &[usize]) -> Result<Vec<CheckResult>, BadReply> {
    if body.len() > MAX_REPLY_LEN {
        return Err(BadReply("reply too long"));
    }
    let text = std::str::from_utf8(body).map_err(|_| BadReply("reply is not UTF-8"))?;
    let mut lines = lines(text);
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

/// `str::lines`, on bytes. A reply is split on every check, and `str`'s char searcher
/// (in `lines` and `split`) makes a `memcmp` call per match, a byte loop in wasm; hence
/// this and the byte splits below. Lines end at `\n` or `\r\n`; a last empty one is none.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(end) = rest.bytes().position(|b| b == b'\n') else {
            return Some(std::mem::take(&mut rest));
        };
        let line = rest.get(..end)?;
        rest = rest.get(end + 1..)?;
        Some(line.strip_suffix('\r').unwrap_or(line))
    })
}

fn decode_line(line: &str, expected: usize) -> Result<CheckResult, BadReply> {
    match (line.as_bytes().first(), line.get(1..)) {
        (Some(b'!'), Some(reason)) => return Ok(CheckResult::Failed(reason.trim().to_string())),
        (Some(b'?'), Some(reason)) => return Ok(CheckResult::Refused(reason.trim().to_string())),
        _ => {}
    }
    let mut fields = line.as_bytes().split(|&b| b == b' ');
    let now_ms = number(fields.next())?;
    let mut rules = Vec::with_capacity(expected);
    let mut settled = 0;
    for field in fields {
        let (field, limit) = match field.iter().position(|&b| b == LIMIT_MARK as u8) {
            Some(at) => {
                let limit = number(field.get(at + 1..)).and_then(|n| match n {
                    0 => Err(BadReply("a limit in force of 0")),
                    n => Ok(n),
                })?;
                (field.get(..at).unwrap_or_default(), limit)
            }
            None => (field, 0),
        };
        let mut parts = field.split(|&b| b == b',');
        let (allowed, blocked) = match parts.next() {
            Some(b"1") => (true, false),
            Some(b"0") => (false, false),
            Some(b"b") => (false, true),
            Some(b"s") => {
                settled += 1;
                rules.push(RuleResult {
                    allowed: true,
                    remaining: number(parts.next())?,
                    owed: number(parts.next())?,
                    borrowed: number(parts.next())?,
                    ..RuleResult::default()
                });
                if parts.next().is_some() || limit > 0 {
                    return Err(BadReply("rule result has extra fields"));
                }
                continue;
            }
            _ => return Err(BadReply("rule result lacks an allowed flag")),
        };
        let result = RuleResult {
            allowed,
            blocked,
            remaining: number(parts.next())?,
            full_ms: number(parts.next())?,
            wait_ms: number(parts.next())?,
            leased: parts.next().map_or(Ok(0), |f| number(Some(f)))?,
            limit,
            ..RuleResult::default()
        };
        if parts.next().is_some() || (result.leased > 0 && !allowed) {
            return Err(BadReply("rule result has extra fields"));
        }
        rules.push(result);
    }
    if rules.len() != expected {
        return Err(BadReply("reply answers a different number of rules"));
    }
    match settled {
        0 => Ok(CheckResult::Checked { now_ms, rules }),
        n if n == rules.len() => Ok(CheckResult::Settled { now_ms, rules }),
        _ => Err(BadReply("a reply line mixes a settlement and a check")),
    }
}

fn number(field: Option<&[u8]>) -> Result<u64, BadReply> {
    field
        .filter(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
        .and_then(|f| std::str::from_utf8(f).ok()?.parse().ok())
        .ok_or(BadReply("malformed number in reply"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::{MAX_CHECKS, MAX_RULES};

    const OK: RuleResult = RuleResult {
        allowed: true,
        blocked: false,
        remaining: 9,
        full_ms: 6000,
        wait_ms: 0,
        leased: 0,
        owed: 0,
        borrowed: 0,
        limit: 0,
    };
    const NO: RuleResult = RuleResult {
        allowed: false,
        blocked: false,
        remaining: 0,
        full_ms: 100,
        wait_ms: 40,
        leased: 0,
        owed: 0,
        borrowed: 0,
        limit: 0,
    };

    #[test]
    fn lines_are_what_str_lines_makes_of_the_text() {
        for text in [
            "",
            "\n",
            "a",
            "a\n",
            "a\nb",
            "a\r\nb\r\n",
            "a\rb\r",
            "\n\na\n\n",
            "\r\n\r",
            "é\n☃\r\n",
        ] {
            let ours: Vec<&str> = lines(text).collect();
            assert_eq!(ours, text.lines().collect::<Vec<_>>(), "{text:?}");
        }
    }

    #[test]
    fn what_the_bridge_renders_the_filter_decodes() {
        let results = vec![
            CheckResult::Checked {
                now_ms: 1_700_000_000_123,
                rules: vec![OK, NO, RuleResult { limit: 5000, ..OK }],
            },
            CheckResult::Failed("redis\ndown".into()),
            CheckResult::Refused("bad key".into()),
        ];
        let mut body = String::new();
        render_reply(&mut body, &results);
        assert_eq!(
            body,
            "1700000000123 1,9,6000,0 0,0,100,40 1,9,6000,0/5000\n! redis down\n? bad key\n"
        );
        let decoded = decode_reply(body.as_bytes(), &[3, 1, 1]).unwrap();
        assert_eq!(decoded[0], results[0]);
        assert_eq!(decoded[1], CheckResult::Failed("redis down".into()));
        assert_eq!(decoded[2], results[2]);
    }

    #[test]
    fn garbage_and_truncated_replies_are_refused() {
        let cases: &[&[u8]] = &[
            b"",
            b"1700000000123",
            b"1700000000123 1,9,6000",
            b"1700000000123 1,9,6000,0,7,1",
            b"1700000000123 0,0,6000,5,7",
            b"1700000000123 2,9,6000,0",
            b"1700000000123 1,-9,6000,0",
            b"1700000000123 1,99999999999999999999999,1,0",
            b"1700000000123 1,9,6000,0 1,9,6000,0",
            b"1700000000123 1,9,6000,0\nextra\n",
            b"<html>502 Bad Gateway</html>",
            b"\xff\xfe 1,9,6000,0",
            b"1700000000123 1,9,6000,0/0",
            b"1700000000123 1,9,6000,0/",
            b"1700000000123 1,9,6000,0/5/5",
            b"1700000000123 s,9,0,0/5",
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

    #[test]
    fn the_largest_possible_reply_fits_and_decodes() {
        let max = RuleResult {
            allowed: true,
            blocked: false,
            remaining: u64::MAX,
            full_ms: u64::MAX,
            wait_ms: u64::MAX,
            leased: u64::MAX,
            owed: 0,
            borrowed: 0,
            limit: u64::MAX,
        };
        let full = CheckResult::Checked {
            now_ms: u64::MAX,
            rules: vec![max; MAX_RULES],
        };
        let mut results = vec![full; MAX_CHECKS];
        results[0] = CheckResult::Failed("x".repeat(10 * MAX_REASON_LEN));
        let mut body = String::new();
        render_reply(&mut body, &results);
        assert!(
            body.len() <= MAX_REPLY_LEN,
            "{} > {MAX_REPLY_LEN}",
            body.len()
        );
        let decoded = decode_reply(body.as_bytes(), &[MAX_RULES; MAX_CHECKS]).unwrap();
        assert_eq!(decoded.len(), MAX_CHECKS);
        assert_eq!(decoded[0], CheckResult::Failed("x".repeat(MAX_REASON_LEN)));
    }
}
