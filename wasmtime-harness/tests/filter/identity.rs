//! Each identity source with present, missing and hostile values, observed in the bucket
//! key of the callout body the filter sends.

use crate::common::{boot, one_rule};
use wasmtime_harness::{pairs, Action, Host};

/// The callout body for one request carrying `headers`, or `None` if the filter let it
/// through without a check (the identity was missing). A request the filter refused is
/// `refused`'s.
fn body_for(host: &mut Host, headers: Vec<wasmtime_harness::Pair>) -> Option<String> {
    match sent(host, headers) {
        Ok(body) => body,
        Err(status) => panic!("refused with {status}"),
    }
}

/// What the filter did with one request carrying `headers`: `Ok` with the callout body
/// (none: let through unchecked), or `Err` with the status of its local reply.
fn sent(host: &mut Host, headers: Vec<wasmtime_harness::Pair>) -> Result<Option<String>, u32> {
    let id = host.new_stream().unwrap();
    let mut all = pairs(&[(":method", "GET"), (":path", "/x"), (":authority", "a")]);
    all.extend(headers);
    match host.request_headers_raw(id, all, true).unwrap() {
        Action::Pause => match host.callout_of(id) {
            Some(callout) => Ok(Some(callout.body_text())),
            None => Err(host.stream(id).unwrap().local_reply().unwrap().status),
        },
        Action::Continue => {
            assert!(host.callout_of(id).is_none());
            Ok(None)
        }
    }
}

fn key_of(body: &str) -> &str {
    body.split(',').next().unwrap()
}

fn header(name: &str, value: &[u8]) -> Vec<wasmtime_harness::Pair> {
    vec![(name.as_bytes().to_vec(), value.to_vec())]
}

#[test]
fn header_identity_present_missing_and_hostile() {
    let mut host = boot(&one_rule(r#"{"header": "x-user-id"}"#, "closed"));
    assert_eq!(
        body_for(&mut host, header("x-user-id", b"alice")).as_deref(),
        Some("rl:r:alice,10,1,6000,1\n")
    );
    assert_eq!(
        body_for(&mut host, header("x-user-id", b"  bob \t")).as_deref(),
        Some("rl:r:bob,10,1,6000,1\n")
    );
    assert_eq!(body_for(&mut host, Vec::new()), None);
    assert_eq!(body_for(&mut host, header("x-user-id", b"   ")), None);
    // Key separators, hash tags and non-UTF-8 bytes are escaped, never passed through.
    let body = body_for(&mut host, header("x-user-id", b"a:b{c}\xff\xfe")).unwrap();
    assert_eq!(key_of(&body), "rl:r:a%3Ab%7Bc%7D%FF%FE");
    // Oversized: a fixed-length digest (SHA-256), so a client cannot grow Redis keys.
    let body = body_for(&mut host, header("x-user-id", &[b'a'; 10_000])).unwrap();
    let key = key_of(&body);
    assert!(
        key.starts_with("rl:r:#") && key.len() == "rl:r:#".len() + 64,
        "{key}"
    );
    let other = body_for(&mut host, header("x-user-id", &[b'b'; 10_000])).unwrap();
    assert_ne!(key_of(&other), key);
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

#[test]
fn verified_jwt_payload_claim() {
    let mut host = boot(&one_rule(
        r#"{"jwt": {"header": "x-jwt-payload", "claim": "sub"}}"#,
        "closed",
    ));
    let payload = b64(br#"{"sub":"carol","iss":"x"}"#);
    let body = body_for(&mut host, header("x-jwt-payload", payload.as_bytes())).unwrap();
    assert_eq!(key_of(&body), "rl:r:carol");
    let numeric = b64(br#"{"sub":42}"#);
    assert_eq!(
        key_of(&body_for(&mut host, header("x-jwt-payload", numeric.as_bytes())).unwrap()),
        "rl:r:42"
    );
    // Other types are keyed on their JSON text; an absent claim is an absent identity.
    let listed = b64(br#"{"sub":["a"]}"#);
    assert_eq!(
        key_of(&body_for(&mut host, header("x-jwt-payload", listed.as_bytes())).unwrap()),
        "rl:r:%5B%22a%22%5D"
    );
    let no_sub = b64(br#"{"iss":"no sub"}"#);
    assert_eq!(
        body_for(&mut host, header("x-jwt-payload", no_sub.as_bytes())),
        None
    );
    assert_eq!(body_for(&mut host, Vec::new()), None);
    // A payload present but unreadable refuses the request: it never exempts it.
    for bad in [
        b64(b"{not json").into_bytes(),
        b"!!!not base64!!!".to_vec(),
        b"\xff\xfe\xfd".to_vec(),
    ] {
        assert_eq!(
            sent(&mut host, header("x-jwt-payload", &bad)),
            Err(400),
            "{:?}",
            String::from_utf8_lossy(&bad)
        );
    }
    // One too long to decode is keyed on its digest.
    let key =
        key_of(&body_for(&mut host, header("x-jwt-payload", &[b'A'; 20_000])).unwrap()).to_string();
    assert!(
        key.starts_with("rl:r:#") && key.len() == "rl:r:#".len() + 64,
        "{key}"
    );
}

#[test]
fn unverified_bearer_token_claim() {
    let mut host = boot(&one_rule(
        r#"{"jwt": {"header": "authorization", "claim": "sub", "unverified": true}}"#,
        "closed",
    ));
    let token = format!("Bearer e30.{}.c2ln", b64(br#"{"sub":"dave"}"#));
    assert_eq!(
        key_of(&body_for(&mut host, header("authorization", token.as_bytes())).unwrap()),
        "rl:r:dave"
    );
    let hostile_claim = format!("Bearer e30.{}.c2ln", b64(br#"{"sub":"x:y}{"}"#));
    assert_eq!(
        key_of(&body_for(&mut host, header("authorization", hostile_claim.as_bytes())).unwrap()),
        "rl:r:x%3Ay%7D%7B"
    );
    // Padding around the token, of any length, is not read.
    let padded = format!("Bearer{}{}=", " ".repeat(9000), &token[7..]);
    assert_eq!(
        key_of(&body_for(&mut host, header("authorization", padded.as_bytes())).unwrap()),
        "rl:r:dave"
    );
    // No token at all (another scheme) is no identity; a token that cannot be read, or
    // two of them joined, refuses the request.
    for none in ["Bearer", "Bearer abc", "Basic dXNlcjpwYXNz"] {
        assert_eq!(
            body_for(&mut host, header("authorization", none.as_bytes())),
            None,
            "{none}"
        );
    }
    let joined = format!("{token},{token}");
    for bad in ["Bearer a.b.c.d", "Bearer a..c", "Bearer a.b", &joined] {
        assert_eq!(
            sent(&mut host, header("authorization", bad.as_bytes())),
            Err(400),
            "{bad}"
        );
    }
}

#[test]
fn peer_address_from_the_source_address_property() {
    let mut host = boot(&one_rule(r#"{"source": "peer"}"#, "closed"));
    // The harness's default `source.address` is 192.0.2.10:50000.
    assert_eq!(
        key_of(&body_for(&mut host, Vec::new()).unwrap()),
        "rl:r:192.0.2.10"
    );
    for (address, key) in [
        // IPv6 on its /64 by default: the client holds all of it.
        ("[2001:db8::1]:443", "rl:r:2001%3Adb8%3A%3A%2F64"),
        ("[::ffff:10.1.2.3]:443", "rl:r:10.1.2.3"),
        ("10.1.2.3:9", "rl:r:10.1.2.3"),
        ("10.1.2.3", "rl:r:10.1.2.3"),
    ] {
        let id = host.new_stream().unwrap();
        host.set_stream_property(id, &["source", "address"], address.as_bytes())
            .unwrap();
        let action = host
            .request_headers(id, &[(":method", "GET"), (":path", "/")], true)
            .unwrap();
        assert_eq!(action, Action::Pause);
        assert_eq!(
            key_of(&host.callout_of(id).unwrap().body_text()),
            key,
            "{address}"
        );
    }
    let id = host.new_stream().unwrap();
    host.set_stream_property(id, &["source", "address"], b"not an address")
        .unwrap();
    assert_eq!(
        host.request_headers(id, &[(":path", "/")], true).unwrap(),
        Action::Continue
    );
}

#[test]
fn forwarded_for_trusts_only_the_configured_hops() {
    let mut host = boot(&one_rule(
        r#"{"source": "xff", "trusted_hops": 1, "gateway_appends": false}"#,
        "closed",
    ));
    let xff = |v: &str| header("x-forwarded-for", v.as_bytes());
    // A client spoofing entries on the left gains nothing: the rightmost one counts.
    assert_eq!(
        key_of(&body_for(&mut host, xff("6.6.6.6, 203.0.113.7")).unwrap()),
        "rl:r:203.0.113.7"
    );
    assert_eq!(
        key_of(&body_for(&mut host, xff("203.0.113.8")).unwrap()),
        "rl:r:203.0.113.8"
    );
    // Missing, garbage or non-UTF-8: fall back to the peer, never to the spoofable value.
    for bad in [&b""[..], b"evil", b"1.1.1.1, garbage", b"\xff\xfe"] {
        let body = body_for(&mut host, header("x-forwarded-for", bad)).unwrap();
        assert_eq!(
            key_of(&body),
            "rl:r:192.0.2.10",
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        key_of(&body_for(&mut host, Vec::new()).unwrap()),
        "rl:r:192.0.2.10"
    );

    let mut two = boot(&one_rule(
        r#"{"source": "xff", "trusted_hops": 2, "gateway_appends": false}"#,
        "closed",
    ));
    assert_eq!(
        key_of(&body_for(&mut two, xff("6.6.6.6, 198.51.100.1, 10.0.0.1")).unwrap()),
        "rl:r:198.51.100.1"
    );
}
