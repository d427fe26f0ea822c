//! Holds `path::normalize` to its normal form for any bytes: idempotent, no query or
//! fragment, no empty (`//`), `.` or `..` segment left.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_config::path::normalize;

fuzz_target!(|raw: &[u8]| {
    let normal = normalize(raw);
    assert_eq!(normalize(&normal), normal, "not idempotent");
    assert!(!normal.windows(2).any(|w| w == b"//"));
    assert!(!normal.contains(&b'?') && !normal.contains(&b'#'));
    assert!(normal
        .split(|&b| b == b'/')
        .all(|segment| segment != b"." && segment != b".."));
});
