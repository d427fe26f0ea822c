//! The token bucket script's calling convention, written once for both of its callers (the
//! bridge, through redis-rs, and the filter's redis-call build, in raw RESP): how a script
//! call's keys and arguments are laid out (`docs/token-bucket.md` documents the layout) and
//! how its reply, a string of packed integers, is checked and read back.
//!
//! One call carries many checks, or parts of checks, applied in order. What Redis pays per
//! rule is kept small: rules that share their parameters (the same configured limit for
//! different clients) send them once per call as a *shape*, and which check has which
//! rules travels as one byte string, so a rule costs one key and two bytes.

use crate::number::u64_string;
use crate::reply::RuleResult;
use crate::request::RuleSpec;
use std::collections::BTreeMap;

/// The token bucket script, the single source of truth for the algorithm.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../lua/token_bucket.lua");

/// Most keys one script call carries, which the script refuses past (its `unpack`s hold
/// about 8000 values in Lua's C stack; the bound also caps the time one call holds the
/// server). Both callers keep it: the bridge splits its calls, the redis-call build its
/// exchanges.
pub const MAX_KEYS_PER_CALL: usize = 1024;
/// Most parts one call carries: with the keys, bounds the layout string the script
/// unpacks (a byte per part and per rule).
pub const MAX_PARTS_PER_CALL: usize = 1024;
/// Most shapes one call can name (a shape index is a byte).
pub const MAX_SHAPES: usize = 255;
/// Most rules of one part (its rule count is a byte).
pub const MAX_PART_RULES: usize = 255;

/// Integers the script answers per rule: remaining, full_ms, wait_ms.
pub const PER_RULE: usize = 3;

/// What a script call does to its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Take each check's cost from all its buckets, or from none.
    Check,
    /// Give each check's cost back (what a lease did not use, or what a check another slot
    /// denied took here).
    Refund,
    /// Answer as `Check` would, taking nothing: whether every slot of a check spanning
    /// several would admit it, before any of them takes.
    Peek,
    /// Apply each rule's settlement (`RuleSpec::settle`) on its own, once per id.
    Settle,
    /// Answer each bucket as it stands (an operator's `usage`): its level signed, debt
    /// included, where `Peek` answers as a check and so counts a denial of a bucket in
    /// debt towards a block. Writes nothing at all.
    Read,
}

impl Mode {
    /// The script's `ARGV[1]`.
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::Refund => "refund",
            Mode::Peek => "peek",
            Mode::Settle => "settle",
            Mode::Read => "read",
        }
    }

    /// The script's `ARGV[1]` for a call whose keys travel in `ARGV` (see
    /// `Layout::spread_args`).
    pub fn spread_arg(self) -> &'static str {
        match self {
            Mode::Check => "check*",
            Mode::Refund => "refund*",
            Mode::Peek => "peek*",
            Mode::Settle => "settle*",
            Mode::Read => "read*",
        }
    }
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

impl Part {
    /// All the rules of check `check`, which has `rules` of them.
    pub fn whole(check: usize, rules: usize) -> Part {
        Part {
            check,
            rules: (0..rules).collect(),
        }
    }
}

/// Numbers per shape in a call's arguments.
pub const SHAPE_LEN: usize = 19;

/// A rule's parameters (burst, num, den, cost (a settlement's delta), its block's after,
/// within, for or zeros, the lease it asks for or 0, 1 in shadow mode, its override's
/// burst, num, den and end or zeros, a settlement's debt or 0, an in-flight rule's slot
/// life in ms or 0, then a calendar quota's four period starts or zeros), which many rules
/// of a batch share. Every number is below 2^53 in size (`parse_batch` sees to it).
pub type Shape = [i64; SHAPE_LEN];

/// The shape of `rule`.
pub fn shape(rule: &RuleSpec) -> Shape {
    let block = rule
        .block
        .map_or([0; 3], |b| [b.after, b.within_ms, b.for_ms]);
    let overridden = rule
        .overridden
        .map_or([0; 4], |o| [o.burst, o.num, o.den, o.until_ms]);
    let (cost, debt) = match &rule.settle {
        Some(settle) => (settle.delta, settle.debt),
        None => (signed(rule.cost), 0),
    };
    let bounds = rule.bounds.unwrap_or_default();
    [
        signed(rule.burst),
        signed(rule.num),
        signed(rule.den),
        cost,
        signed(block[0]),
        signed(block[1]),
        signed(block[2]),
        signed(rule.lease),
        i64::from(rule.shadow),
        signed(overridden[0]),
        signed(overridden[1]),
        signed(overridden[2]),
        signed(overridden[3]),
        signed(debt),
        signed(rule.slot.as_ref().map_or(0, |s| s.ttl_ms)),
        signed(bounds[0]),
        signed(bounds[1]),
        signed(bounds[2]),
        signed(bounds[3]),
    ]
}

/// A number of a rule, all of which are below 2^53 (larger ones, which no caller sends,
/// saturate).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The `remaining` the script answers for a rule whose client is blocked.
const BLOCKED: i64 = -2;
/// The `remaining` it answers for a rule in shadow mode that lacked the cost of a check it
/// did not deny.
const SHADOW_DENIED: i64 = -3;

/// One call's keys and arguments.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout<'c> {
    pub keys: Vec<&'c str>,
    pub shapes: Vec<Shape>,
    /// Per part: its number of rules, then each rule's shape (1-based, as Lua indexes).
    pub checks: Vec<u8>,
    /// Each followed by a space, in order: per part, a settlement's id (`Mode::Settle`
    /// only), then the id of each of its rules' slots.
    pub ids: Vec<u8>,
}

impl Layout<'_> {
    /// The call's arguments in order: the mode, the number of shapes, each shape's
    /// numbers, the checks' byte string, then the ids (settlements' and slots').
    pub fn args(&self, mode: Mode) -> Vec<Vec<u8>> {
        self.args_with(mode.arg(), 0)
    }

    /// The arguments of a call whose keys lie in several hash slots of one Redis Cluster
    /// node, which refuses such keys declared (`CROSSSLOT`) but lets the script reach
    /// them: `args`, the mode marked, then the keys. The call declares only its first key
    /// (`keys[0]`), which routes it to the node.
    pub fn spread_args(&self, mode: Mode) -> Vec<Vec<u8>> {
        let mut args = self.args_with(mode.spread_arg(), self.keys.len());
        args.extend(self.keys.iter().map(|k| k.as_bytes().to_vec()));
        args
    }

    fn args_with(&self, arg: &str, more: usize) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(5 + self.shapes.len() * SHAPE_LEN + more);
        args.push(arg.as_bytes().to_vec());
        args.push(u64_string(self.shapes.len() as u64).into_bytes());
        for &n in self.shapes.iter().flatten() {
            let mut number = if n < 0 {
                String::from("-")
            } else {
                String::new()
            };
            number.push_str(&u64_string(n.unsigned_abs()));
            args.push(number.into_bytes());
        }
        args.push(self.checks.clone());
        args.push(self.ids.clone());
        args
    }
}

/// Lays out one script call over `parts` (in order) of `checks`; fails past the limits
/// above, which the callers keep.
pub fn layout<'c>(checks: &'c [Vec<RuleSpec>], parts: &[Part]) -> Result<Layout<'c>, String> {
    let mut layout = Layout {
        keys: Vec::new(),
        shapes: Vec::new(),
        checks: Vec::new(),
        ids: Vec::new(),
    };
    let mut known: BTreeMap<Shape, u8> = BTreeMap::new();
    for part in parts {
        let rules: Vec<&RuleSpec> = part_rules(checks, part).collect();
        let n = u8::try_from(rules.len())
            .map_err(|_| format!("a check has more than {MAX_PART_RULES} rules"))?;
        layout.checks.push(n);
        if let Some(settle) = rules.first().and_then(|r| r.settle.as_ref()) {
            layout.ids.extend_from_slice(settle.id.as_bytes());
            layout.ids.push(b' ');
        }
        for rule in rules.iter().filter_map(|r| r.slot.as_ref()) {
            layout.ids.extend_from_slice(rule.id.as_bytes());
            layout.ids.push(b' ');
        }
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
    checks: &'c [Vec<RuleSpec>],
    part: &'p Part,
) -> impl Iterator<Item = &'c RuleSpec> + 'p {
    let check = checks.get(part.check);
    part.rules
        .iter()
        .filter_map(move |&i| check.and_then(|c| c.get(i)))
}

/// Why a check that names a key holding a foreign value fails.
pub const FOREIGN_VALUE: &str =
    "a bucket key holds a value the limiter did not write; it is left untouched";

/// What the script answered for one rule: `None` when its check names a key that holds a
/// value the script did not write (the check took nothing).
pub type ScriptOutcome = Option<RuleResult>;

/// Bytes per integer of a script reply.
pub const INTEGER_LEN: usize = 8;

/// The integers of a script reply, which packs them into one string (see the script's
/// `Returns`): little-endian, 64 bits each.
pub fn integers(reply: &[u8]) -> Result<Vec<i64>, String> {
    if reply.len() % INTEGER_LEN != 0 {
        return Err(format!(
            "a script reply of {} bytes is no string of 64-bit integers",
            reply.len()
        ));
    }
    Ok(reply
        .chunks_exact(INTEGER_LEN)
        .map(|chunk| {
            let mut bytes = [0; INTEGER_LEN];
            bytes.copy_from_slice(chunk);
            i64::from_le_bytes(bytes)
        })
        .collect())
}

/// Reads the integers of a script reply (`integers`) to a call in `mode` for `rules` rules:
/// Redis time, then each rule's outcome in order.
pub fn decode(
    mode: Mode,
    reply: &[i64],
    rules: usize,
) -> Result<(u64, Vec<ScriptOutcome>), String> {
    let (Some(&now), Some(rest)) = (reply.first(), reply.get(1..)) else {
        return Err("empty script reply".into());
    };
    if Some(rest.len()) != PER_RULE.checked_mul(rules) {
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
            if let Mode::Settle | Mode::Read = mode {
                // The level in the middle, signed (below 0: owed); around it, settle's
                // whether it applied now or before and what it borrowed, read's ms until
                // full and the ms left of a block.
                let level = RuleResult {
                    remaining: r[1].max(0).unsigned_abs(),
                    owed: r[1].min(0).unsigned_abs(),
                    ..RuleResult::default()
                };
                return Ok(Some(if mode == Mode::Settle {
                    RuleResult {
                        allowed: true,
                        borrowed: unsigned(r[2])?,
                        ..level
                    }
                } else {
                    let block_ms = unsigned(r[2])?;
                    RuleResult {
                        allowed: block_ms == 0,
                        blocked: block_ms > 0,
                        full_ms: unsigned(r[0])?,
                        wait_ms: block_ms,
                        ..level
                    }
                }));
            }
            // An admitted rule that took a lease answers it as a negative wait.
            let (wait_ms, leased) = match r[2] {
                w if w < 0 && r[0] != BLOCKED => (0, w.unsigned_abs()),
                w => (unsigned(w)?, 0),
            };
            let blocked = r[0] == BLOCKED;
            let shadowed = r[0] == SHADOW_DENIED;
            Ok(Some(RuleResult {
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
                ..RuleResult::default()
            }))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((unsigned(now)?, outcomes))
}

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
