//! The token bucket script as redis-rs runs it: a call laid out by the calling convention
//! shared with the filter's redis-call build (`ratelimit_protocol::script`), which also
//! reads the reply back.

use crate::check::Check;
pub use ratelimit_protocol::script::{
    decode, part_rules, shape, Mode, Part, ScriptOutcome, Shape, MAX_PART_RULES, MAX_SHAPES,
    TOKEN_BUCKET_LUA,
};

/// Lays out one script call over `parts` (in order) of `checks`; fails past the script's
/// byte limits, which the planner keeps.
pub fn invocation<'s>(
    script: &'s redis::Script,
    mode: Mode,
    checks: &[Check],
    parts: &[Part],
) -> Result<redis::ScriptInvocation<'s>, String> {
    let layout = ratelimit_protocol::script::layout(checks, parts)?;
    let mut invocation = script.prepare_invoke();
    for key in &layout.keys {
        invocation.key(*key);
    }
    for arg in layout.args(mode) {
        invocation.arg(arg);
    }
    Ok(invocation)
}
