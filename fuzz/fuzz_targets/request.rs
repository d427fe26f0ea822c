//! Holds the bridge's batch parser to refusing any bad body or line without panicking,
//! within the format's bounds, and every line it accepts to surviving the filter's encoding:
//! re-encoded and parsed again, the same rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_protocol::{
    encode_rule, end_check, parse_batch, start_lease_return, start_settlement, LineKind,
    MAX_CHECKS, MAX_RULES,
};

fuzz_target!(|body: &[u8]| {
    let Ok(checks) = parse_batch(body) else {
        return;
    };
    assert!(!checks.is_empty() && checks.len() <= MAX_CHECKS);
    for parsed in checks.into_iter().flatten() {
        let rules = &parsed.rules;
        assert!(!rules.is_empty() && rules.len() <= MAX_RULES);
        let mut line = String::new();
        match parsed.kind {
            LineKind::Check => {}
            LineKind::LeaseReturn => start_lease_return(&mut line),
            LineKind::Settlement => {
                let id = rules.first().and_then(|r| r.settle.as_ref()).map(|s| &s.id);
                start_settlement(&mut line, id.map_or("", String::as_str));
            }
        }
        for (i, r) in rules.iter().enumerate() {
            encode_rule(&mut line, i == 0, r.spec_ref());
        }
        end_check(&mut line);
        assert_eq!(parse_batch(line.as_bytes()), Ok(vec![Ok(parsed)]), "{line}");
    }
});
