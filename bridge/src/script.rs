//! The token bucket script's calling convention, kept apart from the connections: how a
//! script call's keys and arguments are laid out (`lua/token_bucket.lua` documents the
//! layout) and how its flat reply is checked and read back.
//!
//! One call carries many checks, or parts of checks, applied in order. What Redis pays per
//! rule is kept small: rules that share their parameters (the same configured limit for
//! different clients) send them once per call as a *shape*, and which check has which
//! rules travels as one byte string, so a rule costs one key and two bytes.

use crate::check::{Check, RuleOutcome, RuleSpec};
use std::collections::HashMap;

/// The token bucket script, the single source of truth for the algorithm.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../lua/token_bucket.lua");

/// Most shapes one call can name (a shape index is a byte).
pub const MAX_SHAPES: usize = 255;
/// Most rules of one part (its rule count is a byte).
pub const MAX_PART_RULES: usize = 255;

/// Integers the script answers per rule: remaining, full_ms, wait_ms.
const PER_RULE: usize = 3;

/// What a script call does to its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Take each check's cost from all its buckets, or from none.
    Check,
    /// Give each check's cost back (what a check another slot denied took here).
    Refund,
    /// Answer as `Check` would, taking nothing: whether every slot of a check spanning
    /// several would admit it, before any of them takes.
    Peek,
}

/// Some rules of one check that go to one script call: all of the check's rules on a
/// single server, those of one hash slot in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Index of the check in the batch.
    pub check: usize,
    /// Indices of the rules within the check, in the check's order.
    pub rules: Vec<usize>,
}

/// A rule's parameters (burst, num, den, cost, its block's after, within, for or zeros,
/// the lease it asks for or 0, and 1 in shadow mode), which many rules of a batch share.
pub type Shape = [u64; 9];

/// The shape of `rule`.
pub fn shape(rule: &RuleSpec) -> Shape {
    let block = rule
        .block
        .map_or([0; 3], |b| [b.after, b.within_ms, b.for_ms]);
    [
        rule.burst,
        rule.num,
        rule.den,
        rule.cost,
        block[0],
        block[1],
        block[2],
        rule.lease,
        u64::from(rule.shadow),
    ]
}

/// The `remaining` the script answers for a rule whose client is blocked.
const BLOCKED: i64 = -2;
/// The `remaining` it answers for a rule in shadow mode that lacked the cost of a check it
/// did not deny.
const SHADOW_DENIED: i64 = -3;

/// Lays out one script call over `parts` (in order) of `checks`; fails past the limits
/// above, which the planner keeps.
pub fn invocation<'s>(
    script: &'s redis::Script,
    mode: Mode,
    checks: &[Check],
    parts: &[Part],
) -> Result<redis::ScriptInvocation<'s>, String> {
    let layout = layout(checks, parts)?;
    let mut invocation = script.prepare_invoke();
    for key in layout.keys {
        invocation.key(key);
    }
    invocation.arg(match mode {
        Mode::Check => "check",
        Mode::Refund => "refund",
        Mode::Peek => "peek",
    });
    invocation.arg(layout.shapes.len());
    for shape in &layout.shapes {
        invocation.arg(&shape[..]);
    }
    invocation.arg(layout.checks);
    Ok(invocation)
}

/// One call's keys and arguments.
#[derive(Debug, PartialEq, Eq)]
struct Layout<'c> {
    keys: Vec<&'c str>,
    shapes: Vec<Shape>,
    /// Per part: its number of rules, then each rule's shape (1-based, as Lua indexes).
    checks: Vec<u8>,
}

fn layout<'c>(checks: &'c [Check], parts: &[Part]) -> Result<Layout<'c>, String> {
    let mut layout = Layout {
        keys: Vec::new(),
        shapes: Vec::new(),
        checks: Vec::new(),
    };
    let mut known: HashMap<Shape, u8> = HashMap::new();
    for part in parts {
        let rules: Vec<&RuleSpec> = part_rules(checks, part).collect();
        let n = u8::try_from(rules.len())
            .map_err(|_| format!("a check has more than {MAX_PART_RULES} rules"))?;
        layout.checks.push(n);
        for rule in rules {
            layout.keys.push(&rule.key);
            let index = match known.get(&shape(rule)) {
                Some(&index) => index,
                None => {
                    let index = u8::try_from(layout.shapes.len() + 1)
                        .map_err(|_| format!("more than {MAX_SHAPES} rule shapes in a call"))?;
                    layout.shapes.push(shape(rule));
                    known.insert(shape(rule), index);
                    index
                }
            };
            layout.checks.push(index);
        }
    }
    Ok(layout)
}

/// The rules of `part`, in order (indices out of range, which the planner never makes,
/// are skipped).
pub fn part_rules<'c: 'p, 'p>(
    checks: &'c [Check],
    part: &'p Part,
) -> impl Iterator<Item = &'c RuleSpec> + 'p {
    let check = checks.get(part.check);
    part.rules
        .iter()
        .filter_map(move |&i| check.and_then(|c| c.get(i)))
}

/// What the script answered for one rule: `None` when its check names a key that holds a
/// value the script did not write (the check took nothing).
pub type ScriptOutcome = Option<RuleOutcome>;

/// Reads a script reply for `rules` rules: Redis time, then each rule's outcome in order.
pub fn decode(reply: &[i64], rules: usize) -> Result<(u64, Vec<ScriptOutcome>), String> {
    let (Some(&now), Some(rest)) = (reply.first(), reply.get(1..)) else {
        return Err("empty script reply".into());
    };
    if rest.len() != PER_RULE * rules {
        return Err(format!(
            "script answered {} values for {rules} rules",
            rest.len()
        ));
    }
    let unsigned = |v: i64| u64::try_from(v).map_err(|_| format!("negative value {v} from script"));
    let outcomes = rest
        .chunks_exact(PER_RULE)
        .map(|r| {
            if r == [-1, -1, -1] {
                return Ok(None);
            }
            // An admitted rule that took a lease answers it as a negative wait.
            let (wait_ms, leased) = match r[2] {
                w if w < 0 && r[0] != BLOCKED => (0, w.unsigned_abs()),
                w => (unsigned(w)?, 0),
            };
            let blocked = r[0] == BLOCKED;
            let shadowed = r[0] == SHADOW_DENIED;
            Ok(Some(RuleOutcome {
                allowed: (wait_ms == 0 && !blocked) || shadowed,
                blocked,
                remaining: if blocked || shadowed {
                    0
                } else {
                    unsigned(r[0])?
                },
                full_ms: unsigned(r[1])?,
                wait_ms,
                leased,
            }))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((unsigned(now)?, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: &str, burst: u64, cost: u64) -> RuleSpec {
        RuleSpec {
            key: key.into(),
            burst,
            num: 1,
            den: 600,
            cost,
            lease: 0,
            block: None,
            shadow: false,
        }
    }

    #[test]
    fn script_replies_of_the_wrong_shape_are_errors() {
        assert!(decode(&[], 0).is_err());
        assert!(decode(&[1, 1, 2], 1).is_err());
        assert!(decode(&[1, 1, 2, 3, 4], 1).is_err());
        assert!(decode(&[1, -1, 2, 3], 1).is_err());
        assert!(decode(&[-1], 0).is_err());
        assert_eq!(decode(&[7], 0).unwrap(), (7, vec![]));
    }

    #[test]
    fn a_rule_admits_when_it_has_nothing_to_wait_for() {
        let (now, rules) = decode(&[5, 1, 2, 3, 4, 5, 0, -1, -1, -1], 3).unwrap();
        assert_eq!(now, 5);
        assert_eq!(
            rules,
            vec![
                Some(RuleOutcome {
                    allowed: false,
                    blocked: false,
                    remaining: 1,
                    full_ms: 2,
                    wait_ms: 3,
                    leased: 0
                }),
                Some(RuleOutcome {
                    allowed: true,
                    blocked: false,
                    remaining: 4,
                    full_ms: 5,
                    wait_ms: 0,
                    leased: 0
                }),
                None,
            ]
        );
    }

    #[test]
    fn rules_sharing_parameters_send_them_once() {
        let checks = vec![
            vec![rule("a", 10, 1), rule("b", 5, 1)],
            vec![rule("c", 10, 1)],
        ];
        let parts = [
            Part {
                check: 0,
                rules: vec![0, 1],
            },
            Part {
                check: 1,
                rules: vec![0],
            },
        ];
        let layout = layout(&checks, &parts).unwrap();
        assert_eq!(layout.keys, ["a", "b", "c"]);
        assert_eq!(
            layout.shapes,
            [
                [10, 1, 600, 1, 0, 0, 0, 0, 0],
                [5, 1, 600, 1, 0, 0, 0, 0, 0]
            ]
        );
        // Each part: its size and its rules' shapes.
        assert_eq!(layout.checks, [2, 1, 2, 1, 1]);
    }

    #[test]
    fn a_call_past_the_byte_limits_is_refused() {
        let many: Check = (0..=MAX_PART_RULES as u64)
            .map(|i| rule(&format!("k{i}"), 1 + i, 1))
            .collect();
        let all = Part {
            check: 0,
            rules: (0..many.len()).collect(),
        };
        let checks = vec![many];
        assert!(layout(&checks, std::slice::from_ref(&all)).is_err());
        // 256 one-rule parts, each of its own shape.
        let parts: Vec<Part> = (0..=MAX_SHAPES)
            .map(|i| Part {
                check: 0,
                rules: vec![i],
            })
            .collect();
        assert!(layout(&checks, &parts).is_err());
        assert!(layout(&checks, &parts[..MAX_SHAPES]).is_ok());
    }
}
