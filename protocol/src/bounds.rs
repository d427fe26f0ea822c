//! Every bound of the format in one place, derived from each other so that a reply to any
//! request the bridge accepts always fits what the filter reads.

/// Largest request body (HTTP) or message (stream, without the id line) the bridge reads.
pub const MAX_BODY: usize = 256 * 1024;
/// Most checks one exchange may carry.
pub const MAX_CHECKS: usize = 1024;
/// Most rules one check may carry (the filter refuses configurations with more).
pub const MAX_RULES: usize = 32;
/// Longest bucket key.
pub const MAX_KEY_LEN: usize = 512;
/// Integers the Lua script keeps exact (doubles): every number sent stays below this.
pub const MAX_EXACT: u64 = 1 << 53;
/// Longest reason of a failed check; the bridge cuts longer ones.
pub const MAX_REASON_LEN: usize = 200;

/// Digits of the largest `u64`.
const U64_DIGITS: usize = 20;
/// ` 1,remaining,full_ms,wait_ms,leased/limit`, each number a `u64` at worst.
const MAX_RULE_RESULT_LEN: usize = 1 + 2 + 5 * U64_DIGITS + 4;
const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}
/// Longest reply line, newline included.
pub const MAX_REPLY_LINE: usize = max(
    U64_DIGITS + MAX_RULES * MAX_RULE_RESULT_LEN,
    2 + MAX_REASON_LEN,
) + 1;
/// Longest reply (HTTP body or stream message, id line included) the filter accepts: the
/// answer to `MAX_CHECKS` checks of `MAX_RULES` rules each, so never a legitimate one
/// is refused.
pub const MAX_REPLY_LEN: usize = U64_DIGITS + 1 + MAX_CHECKS * MAX_REPLY_LINE;
/// Longest exchange id line (a `u32` and its newline).
pub const MAX_ID_LINE: usize = 11;
