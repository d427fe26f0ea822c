//! The redis-call build's side of Redis, host-independent: an exchange's batch (the same
//! lines the bridge reads) becomes one raw RESP `EVALSHA` of the token bucket script, laid
//! out by the calling convention the bridge uses too (`ratelimit_protocol::script`), and
//! the script's reply becomes the same `CheckResult`s the bridge's reply would have. So
//! only the transport differs; every decision above it is shared.
//!
//! Replies come from the network through the host: they are read strictly (exactly the
//! string of packed integers the call asked for, nothing before or after) and anything
//! else fails the exchange, never the VM.

use crate::wire::{CheckResult, RuleResult};
use ratelimit_protocol::script::{self, Mode, Part, TOKEN_BUCKET_LUA};
use ratelimit_protocol::{
    parse_batch, LineKind, LEASE_RETURN_MARK, MAX_REASON_LEN, MAX_REPLY_LEN, SETTLEMENT_MARK,
};
use std::sync::OnceLock;

/// The SHA1 of the script, as `EVALSHA` names it (computed once: hashing the script on
/// every call would cost more than the call's encoding).
pub fn script_sha1() -> &'static str {
    static SHA1: OnceLock<String> = OnceLock::new();
    SHA1.get_or_init(|| sha1_smol::Sha1::from(TOKEN_BUCKET_LUA).digest().to_string())
}

/// How a call names the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invoke {
    /// `EVALSHA <sha1>`: the script stays on the server, a call carries 40 bytes of it.
    Sha,
    /// `EVAL <script>`: after a `NOSCRIPT` (a restarted or flushed server), which also
    /// loads it again for the following `EVALSHA`s.
    Text,
}

/// The script mode of a line (see `Line`), which all lines of a batch share here.
pub fn mode_of(kind: &LineKind) -> Mode {
    match kind {
        LineKind::Check => Mode::Check,
        LineKind::LeaseReturn => Mode::Refund,
        LineKind::Settlement => Mode::Settle,
    }
}

/// The script mode of a batch's body: its first line's (`mode_of`).
pub fn batch_mode(body: &str) -> Mode {
    if body.starts_with(LEASE_RETURN_MARK) {
        Mode::Refund
    } else if body.starts_with(SETTLEMENT_MARK) {
        Mode::Settle
    } else {
        Mode::Check
    }
}

/// The RESP query running an exchange's batch (`body`, lines of the callout protocol):
/// one script call over all its lines, in order, each line a part of its own, so each
/// check stays all-or-nothing. A batch is all checks, all lease returns or all settlements
/// (the script has one mode per call; the worker's group commit keeps them apart).
pub fn script_query(body: &str, invoke: Invoke) -> Result<Vec<u8>, String> {
    let lines = parse_batch(body.as_bytes()).map_err(|e| e.0)?;
    let lines = lines.into_iter().collect::<Result<Vec<_>, String>>()?;
    let mode = batch_mode(body);
    if lines.iter().any(|l| mode_of(&l.kind) != mode) {
        return Err("a batch mixes checks, lease returns and settlements".into());
    }
    let checks: Vec<_> = lines.into_iter().map(|l| l.rules).collect();
    let parts: Vec<Part> = checks
        .iter()
        .enumerate()
        .map(|(i, rules)| Part::whole(i, rules.len()))
        .collect();
    let layout = script::layout(&checks, &parts)?;
    let numkeys = layout.keys.len().to_string();
    let (verb, script): (&[u8], &[u8]) = match invoke {
        Invoke::Sha => (b"EVALSHA", script_sha1().as_bytes()),
        Invoke::Text => (b"EVAL", TOKEN_BUCKET_LUA.as_bytes()),
    };
    let args = layout.args(mode);
    let mut query = Vec::with_capacity(64 + body.len() * 2);
    push_header(&mut query, b'*', 3 + layout.keys.len() + args.len());
    for arg in [verb, script, numkeys.as_bytes()]
        .into_iter()
        .chain(layout.keys.iter().map(|k| k.as_bytes()))
        .chain(args.iter().map(Vec::as_slice))
    {
        push_header(&mut query, b'$', arg.len());
        query.extend_from_slice(arg);
        query.extend_from_slice(b"\r\n");
    }
    Ok(query)
}

fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Whether `reply` is Redis saying it does not know the script (`-NOSCRIPT ...`).
pub fn is_noscript(reply: &[u8]) -> bool {
    reply.starts_with(b"-NOSCRIPT")
}

/// Reads the script's reply to a batch in `mode` whose checks have `rules_per_check`
/// rules: one result per check, in order. A Redis error, or a reply that is not exactly
/// the string of integers expected, fails the whole exchange.
pub fn decode_reply(
    reply: &[u8],
    mode: Mode,
    rules_per_check: &[usize],
) -> Result<Vec<CheckResult>, String> {
    let rules: usize = rules_per_check.iter().sum();
    let expected = rules
        .checked_mul(script::PER_RULE)
        .and_then(|n| n.checked_add(1))
        .ok_or("too many rules")?;
    let values = integers(reply, expected)?;
    let (now_ms, mut outcomes) = script::decode(mode, &values, rules)?;
    let mut results = Vec::with_capacity(rules_per_check.len());
    let mut rest = outcomes.drain(..);
    for &n in rules_per_check {
        // Each check consumes its own rules, even after a foreign one.
        let check: Vec<Option<RuleResult>> = rest.by_ref().take(n).collect();
        results.push(match check.into_iter().collect() {
            Some(rules) if mode == Mode::Settle => CheckResult::Settled { now_ms, rules },
            Some(rules) => CheckResult::Checked { now_ms, rules },
            None => CheckResult::Failed(script::FOREIGN_VALUE.into()),
        });
    }
    Ok(results)
}

/// The `expected` integers of a script reply: a RESP bulk string of exactly that many
/// packed integers (see `script::integers`), nothing before or after it.
fn integers(reply: &[u8], expected: usize) -> Result<Vec<i64>, String> {
    if reply.len() > MAX_REPLY_LEN {
        return Err("redis reply too long".into());
    }
    let mut cursor = Cursor { rest: reply };
    let (kind, header) = cursor.line().ok_or("empty or truncated redis reply")?;
    match kind {
        b'$' => {}
        b'-' => return Err(format!("redis: {}", printable(header))),
        _ => {
            return Err(format!(
                "redis answered {:?}, not a string",
                char::from(kind)
            ))
        }
    }
    let len = expected
        .checked_mul(script::INTEGER_LEN)
        .ok_or("too many rules")?;
    if parse_i64(header) != i64::try_from(len).ok() {
        return Err(format!(
            "redis answered a string of {} bytes, not {expected} integers",
            printable(header)
        ));
    }
    let (Some(packed), Some(b"\r\n")) = (cursor.rest.get(..len), cursor.rest.get(len..)) else {
        return Err("redis reply truncated, or bytes after it".into());
    };
    script::integers(packed)
}

/// Reads RESP lines off the front of a reply.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// The next line's type byte and content, without its `\r\n`.
    fn line(&mut self) -> Option<(u8, &'a [u8])> {
        let end = self.rest.windows(2).position(|w| w == b"\r\n")?;
        let (&kind, content) = self.rest.get(..end)?.split_first()?;
        self.rest = self.rest.get(end + 2..)?;
        Some((kind, content))
    }
}

/// A RESP integer: an optional `-` and 1 to 19 digits, nothing else.
fn parse_i64(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Server text for a log line: printable ASCII, bounded.
fn printable(text: &[u8]) -> String {
    text.iter()
        .take(MAX_REASON_LEN)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "redis_call_tests.rs"]
mod tests;
