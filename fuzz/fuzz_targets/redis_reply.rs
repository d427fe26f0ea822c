//! Holds the redis-call build's reading of Redis replies (raw RESP from the network,
//! through the host) to refusing anything but the exact string of packed integers a script
//! call asked for, without panicking, and to reading back any well-formed one of that
//! length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_filter::wire::redis_call::decode_reply;
use ratelimit_filter::wire::CheckResult;
use ratelimit_fuzz::counts_and_reply;
use ratelimit_protocol::script::Mode;
use ratelimit_protocol::MAX_RULES;

fuzz_target!(|data: &[u8]| {
    let (counts, reply) = counts_and_reply(data, MAX_RULES);
    for mode in [Mode::Check, Mode::Settle] {
        if let Ok(results) = decode_reply(reply, mode, &counts) {
            assert_eq!(results.len(), counts.len());
        }
    }
    // The same counts answered well: Redis time, then per rule remaining, full, wait, as
    // one bulk string of little-endian 64-bit integers.
    let rules: usize = counts.iter().sum();
    let mut values = vec![1_767_225_600_000i64];
    for (i, byte) in reply.iter().chain(b"7").cycle().take(3 * rules).enumerate() {
        values.push(i64::from(*byte) - i64::from(i % 3 == 2));
    }
    let mut good = format!("${}\r\n", 8 * values.len()).into_bytes();
    for v in &values {
        good.extend_from_slice(&v.to_le_bytes());
    }
    good.extend_from_slice(b"\r\n");
    let results =
        decode_reply(&good, Mode::Check, &counts).unwrap_or_else(|e| panic!("{e}: {good:?}"));
    for (result, &n) in results.iter().zip(&counts) {
        match result {
            CheckResult::Checked { rules, .. } => assert_eq!(rules.len(), n),
            CheckResult::Failed(_) => {} // a rule answered the foreign value's -1s
            CheckResult::Refused(why) => panic!("refused: {why}"),
            CheckResult::Settled { .. } => panic!("a check read as a settlement"),
        }
    }
});
