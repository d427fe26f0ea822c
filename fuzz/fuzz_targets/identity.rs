//! Holds `identity::resolve` to turning hostile headers, tokens and addresses, through every
//! kind of source, into nothing or a value that is key-safe and bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_config::source::{Address, Forwarded, Source};
use ratelimit_filter::host::{RequestView, Sole};
use ratelimit_filter::request::identity::{resolve, BadIdentity, Place, Problem};
use ratelimit_fuzz::{bearer, payload, Request};
use ratelimit_protocol::key;

fuzz_target!(|data: &[u8]| {
    // A byte choosing the source (its high bit: an unverified JWT, or a gateway that appends
    // to X-Forwarded-For), a byte of trusted hops (and of the IPv6 prefix), then the
    // request (`Request::from_lines`).
    let [kind, hops, request @ ..] = data else {
        return;
    };
    let flag = kind & 0x80 != 0;
    let mut request = Request::from_lines(request);
    let jwt = Source::Jwt {
        header: "authorization".into(),
        claim: "sub".into(),
        unverified: flag,
    };
    let source = match (kind & 0x7f) % 5 {
        0 => Source::Header("x-user-id".into()),
        1 => jwt,
        2 => {
            for value in &mut request.headers {
                let sub = payload(&String::from_utf8_lossy(value));
                *value = if flag { bearer(&sub) } else { sub }.into_bytes();
            }
            jwt
        }
        kind => Source::Address(Address {
            forwarded: (kind == 4).then_some(Forwarded {
                hops: u32::from(*hops),
                gateway_appends: flag,
            }),
            ipv6_prefix: 1 + hops % 128,
        }),
    };
    match resolve(&source, &request) {
        // A value of the keys' grammar: key-safe and bounded.
        Ok(Some(v)) => assert!(key::is_value(&v), "{v:?}"),
        Ok(None) => {}
        Err(BadIdentity { at, problem }) => {
            let Place::Header(header) = at else {
                panic!("{at:?}: `resolve` reads no body")
            };
            let sole = request.sole_header(&header);
            match problem {
                // Twice, or a JWT's copies joined with a comma.
                Problem::Repeated => assert!(
                    sole == Sole::Repeated || matches!(sole, Sole::Once(v) if v.contains(&b',')),
                    "{header} is not repeated"
                ),
                Problem::Unreadable => assert!(
                    matches!(source, Source::Jwt { .. }) && matches!(sole, Sole::Once(_)),
                    "{header} is not an unreadable JWT"
                ),
                Problem::NotAString | Problem::BodyUnreadable => panic!("{problem:?}: no body"),
            }
        }
    }
});
