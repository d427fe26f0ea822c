//! Holds the JWT claim reader to reading any bytes as a claim or as nothing, without
//! panicking, and to reading back whatever claim a well-formed payload or token carries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_filter::jwt::claim;
use ratelimit_fuzz::{bearer, payload};

fuzz_target!(|data: &[u8]| {
    for unverified in [false, true] {
        let _ = claim(data, "sub", unverified);
    }
    let sub = String::from_utf8_lossy(data);
    let forwarded = payload(&sub);
    assert_eq!(
        claim(forwarded.as_bytes(), "sub", false).as_deref(),
        Some(&*sub)
    );
    let token = bearer(&forwarded);
    assert_eq!(claim(token.as_bytes(), "sub", true).as_deref(), Some(&*sub));
});
