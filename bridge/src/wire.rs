//! The `/v1/check` wire format, bridge side: strict parsing of the filter's batch and
//! rendering of the reply. The format is specified in `filter/src/protocol.rs`.

use std::fmt::Write;

/// Largest request body accepted.
pub const MAX_BODY: usize = 256 * 1024;
/// Most checks (paused requests) one callout may carry.
pub const MAX_CHECKS: usize = 1024;
/// Most rules one check may carry (the filter refuses configs with more).
pub const MAX_RULES: usize = 32;
/// Longest bucket key accepted.
pub const MAX_KEY_LEN: usize = 512;
/// Integers the Lua script must keep exact (doubles).
const MAX_EXACT: u64 = 1 << 53;

/// One rule of a check: the bucket and how it fills and drains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub key: String,
    pub burst: u64,
    pub num: u64,
    pub den: u64,
    pub cost: u64,
}

/// One request's rules, checked all-or-nothing.
pub type Check = Vec<RuleSpec>;

/// The outcome of one rule, as the script returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleOutcome {
    pub allowed: bool,
    pub remaining: u64,
    pub full_ms: u64,
    pub wait_ms: u64,
}

/// The outcome of one check: Redis time and per-rule outcomes, or why it failed.
pub type CheckOutcome = Result<(u64, Vec<RuleOutcome>), String>;

/// Parses a request body; the error says what is wrong and where.
pub fn parse_batch(body: &[u8]) -> Result<Vec<Check>, String> {
    if body.len() > MAX_BODY {
        return Err(format!("body over {MAX_BODY} bytes"));
    }
    let text = std::str::from_utf8(body).map_err(|_| "body is not UTF-8".to_string())?;
    let mut checks = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if checks.len() == MAX_CHECKS {
            return Err(format!("more than {MAX_CHECKS} checks"));
        }
        checks.push(parse_check(line).map_err(|e| format!("check {}: {e}", n + 1))?);
    }
    if checks.is_empty() {
        return Err("no check in body".into());
    }
    Ok(checks)
}

fn parse_check(line: &str) -> Result<Check, String> {
    let mut rules: Check = Vec::new();
    for field in line.split(' ') {
        if rules.len() == MAX_RULES {
            return Err(format!("more than {MAX_RULES} rules"));
        }
        let rule = parse_rule(field)?;
        if rules.iter().any(|r| r.key == rule.key) {
            return Err(format!("key {:?} appears twice", rule.key));
        }
        rules.push(rule);
    }
    Ok(rules)
}

fn parse_rule(field: &str) -> Result<RuleSpec, String> {
    let mut parts = field.split(',');
    let key = parts.next().unwrap_or_default();
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("bad key {key:?}"));
    }
    let mut number = |name: &str| -> Result<u64, String> {
        parts
            .next()
            .and_then(|p| p.parse::<u64>().ok())
            .filter(|&n| (1..MAX_EXACT).contains(&n))
            .ok_or_else(|| format!("{name} of {key:?} must be an integer from 1 to 2^53"))
    };
    let rule = RuleSpec {
        key: key.to_string(),
        burst: number("burst")?,
        num: number("num")?,
        den: number("den")?,
        cost: number("cost")?,
    };
    if parts.next().is_some() {
        return Err(format!("rule {key:?} has extra fields"));
    }
    if u128::from(rule.burst) * u128::from(rule.den) >= u128::from(MAX_EXACT) {
        return Err(format!("burst x den of {key:?} must stay below 2^53"));
    }
    if rule.cost > rule.burst {
        return Err(format!("cost of {key:?} exceeds its burst"));
    }
    Ok(rule)
}

/// Renders one reply line per check, in order.
pub fn render_reply(outcomes: &[CheckOutcome]) -> String {
    let mut out = String::with_capacity(outcomes.len() * 48);
    for outcome in outcomes {
        match outcome {
            Ok((now_ms, rules)) => {
                let _ = write!(out, "{now_ms}");
                for r in rules {
                    let _ = write!(
                        out,
                        " {},{},{},{}",
                        u8::from(r.allowed),
                        r.remaining,
                        r.full_ms,
                        r.wait_ms
                    );
                }
            }
            // A reason must stay on its line.
            Err(reason) => {
                out.push_str("! ");
                out.extend(reason.chars().map(|c| if c.is_control() { ' ' } else { c }));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_checks_parses() {
        let checks = parse_batch(b"rl:a:x,10,1,6000,1 rl:g,5,50,1,2\nrl:b,1,1,1,1\n").unwrap();
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[0][1],
            RuleSpec {
                key: "rl:g".into(),
                burst: 5,
                num: 50,
                den: 1,
                cost: 2
            }
        );
    }

    #[test]
    fn invalid_input_is_refused_with_a_reason() {
        let long_key = format!("{},1,1,1,1", "k".repeat(MAX_KEY_LEN + 1));
        let too_many_rules = (0..=MAX_RULES)
            .map(|i| format!("k{i},1,1,1,1"))
            .collect::<Vec<_>>()
            .join(" ");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "no check"),
            (b"\n".to_vec(), "bad key"),
            (b"k,1,1,1".to_vec(), "cost"),
            (b"k,1,1,1,1,1".to_vec(), "extra"),
            (b"k,0,1,1,1".to_vec(), "burst"),
            (b"k,1,1,1,2".to_vec(), "exceeds"),
            (b"k,1,x,1,1".to_vec(), "num"),
            (b"k,100000000,1,100000000,1".to_vec(), "2^53"),
            (b"k,9007199254740992,1,1,1".to_vec(), "burst"),
            (b"k,1,1,1,1 k,1,1,1,1".to_vec(), "twice"),
            (b"k,1,1,1,1  j,1,1,1,1".to_vec(), "bad key"),
            (b"\xff,1,1,1,1".to_vec(), "UTF-8"),
            (long_key.into_bytes(), "bad key"),
            (too_many_rules.into_bytes(), "rules"),
            ("k,1,1,1,1\n".repeat(MAX_CHECKS + 1).into_bytes(), "checks"),
            (vec![b'k'; MAX_BODY + 1], "body over"),
        ];
        for (body, expect) in cases {
            let e = parse_batch(&body).unwrap_err();
            assert!(
                e.contains(expect),
                "{:?}: {e}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
    }

    #[test]
    fn replies_render_one_line_per_check() {
        let ok = RuleOutcome {
            allowed: true,
            remaining: 9,
            full_ms: 600,
            wait_ms: 0,
        };
        let no = RuleOutcome {
            allowed: false,
            remaining: 0,
            full_ms: 6000,
            wait_ms: 600,
        };
        let reply = render_reply(&[Ok((17, vec![ok, no])), Err("redis\ndown".into())]);
        assert_eq!(reply, "17 1,9,600,0 0,0,6000,600\n! redis down\n");
    }
}
