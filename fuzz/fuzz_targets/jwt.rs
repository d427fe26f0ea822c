//! Holds the JWT claim reader to reading any bytes as a claim, nothing or unreadable,
//! without panicking, and to reading back whatever claim a well-formed payload or token
//! carries (or handing back a payload too long to decode).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_filter::request::jwt::{read, Reading, MAX_PAYLOAD_LEN};
use ratelimit_fuzz::{bearer, payload};

fuzz_target!(|data: &[u8]| {
    for unverified in [false, true] {
        let _ = read(data, "sub", unverified);
    }
    let sub = String::from_utf8_lossy(data);
    let forwarded = payload(&sub);
    let expected = match forwarded.len() > MAX_PAYLOAD_LEN {
        true => Reading::TooLong(forwarded.as_bytes()),
        false => Reading::Claim(Some(sub.to_string())),
    };
    assert_eq!(read(forwarded.as_bytes(), "sub", false), expected);
    let token = bearer(&forwarded);
    assert_eq!(read(token.as_bytes(), "sub", true), expected);
});
