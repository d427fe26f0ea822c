//! Reads one claim out of a JWT payload, without trusting anything about its shape.
//!
//! Two inputs are accepted: the payload Envoy's `jwt_authn` filter forwards after verifying
//! the token (`forward_payload_header`: base64url JSON), or, when the configuration says
//! `"unverified": true`, a bearer token whose signature nobody checked.

/// The claim's value as text (strings as is, numbers in decimal); `None` for anything
/// malformed, absent, or of another type.
pub fn claim(raw: &[u8], claim: &str, unverified: bool) -> Option<String> {
    let payload = if unverified {
        payload_of_token(raw)?
    } else {
        raw
    };
    let json = base64url_decode(payload)?;
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&json).ok()?;
    match object.get(claim)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The middle segment of `[Bearer ]header.payload.signature`.
fn payload_of_token(raw: &[u8]) -> Option<&[u8]> {
    let token = match raw.get(..7) {
        Some(prefix) if prefix.eq_ignore_ascii_case(b"bearer ") => raw.get(7..)?.trim_ascii(),
        _ => raw,
    };
    let mut parts = token.split(|&b| b == b'.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next().is_none().then_some(payload)
}

fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' | b'+' => 62,
        b'_' | b'/' => 63,
        _ => return None,
    }))
}

/// Base64url (the standard alphabet is accepted too), padding optional.
pub fn base64url_decode(text: &[u8]) -> Option<Vec<u8>> {
    let text = match text.iter().position(|&b| b == b'=') {
        Some(pad) if text[pad..].iter().all(|&b| b == b'=') => &text[..pad],
        Some(_) => return None,
        None => text,
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | sextet(c)?;
        }
        acc <<= 6 * (4 - chunk.len() as u32);
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(data: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
    }

    #[test]
    fn base64url_round_trips_every_length() {
        let data: Vec<u8> = (0..=255u8).collect();
        for len in 0..40 {
            assert_eq!(
                base64url_decode(b64(&data[..len]).as_bytes()).unwrap(),
                &data[..len]
            );
        }
        assert_eq!(base64url_decode(b"aGk=").unwrap(), b"hi");
    }

    #[test]
    fn malformed_base64_is_refused() {
        for bad in [&b"a"[..], b"ab=c", b"a b", b"\xff\xfe", b"abcde"] {
            assert_eq!(base64url_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn forwarded_payload_gives_string_and_number_claims() {
        let payload = b64(br#"{"sub":"alice","tier":"premium","uid":42,"admin":true}"#);
        assert_eq!(
            claim(payload.as_bytes(), "sub", false).as_deref(),
            Some("alice")
        );
        assert_eq!(
            claim(payload.as_bytes(), "uid", false).as_deref(),
            Some("42")
        );
        assert_eq!(claim(payload.as_bytes(), "admin", false), None);
        assert_eq!(claim(payload.as_bytes(), "missing", false), None);
    }

    #[test]
    fn bearer_token_is_read_only_when_unverified_is_allowed() {
        let token = format!("Bearer e30.{}.c2ln", b64(br#"{"sub":"bob"}"#));
        assert_eq!(claim(token.as_bytes(), "sub", true).as_deref(), Some("bob"));
        // As a forwarded payload the whole token is not base64: refused.
        assert_eq!(claim(token.as_bytes(), "sub", false), None);
    }

    #[test]
    fn malformed_tokens_yield_nothing() {
        let p = b64(br#"{"sub":"bob"}"#);
        for bad in [
            String::from("Bearer"),
            format!("Bearer {p}"),
            format!("Bearer a.{p}.c.d"),
            format!("Bearer a.{}.c", b64(b"[1,2]")),
            format!("Bearer a.{}.c", b64(b"{not json")),
            "Bearer a..c".into(),
        ] {
            assert_eq!(claim(bad.as_bytes(), "sub", true), None, "{bad}");
        }
    }
}
