//! Reads one claim out of a JWT payload, without trusting anything about its shape.
//!
//! Two inputs are accepted: the payload Envoy's `jwt_authn` filter forwards after verifying
//! the token (`forward_payload_header`: base64url JSON), or, when the configuration says
//! `"unverified": true`, a bearer token whose signature nobody checked.
//!
//! Whatever surrounds a token's three segments is not looked at (padding, a scheme other
//! than `Bearer `, junk `jwt_authn` skips), nor are its header and signature: only the
//! payload is read, so no padding that a verifier lets through can make it unreadable here.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// Longest payload decoded (base64url, its `=` padding dropped); a longer one is not
/// decoded but named whole by its digest (`identity`), so that reading it stays bounded.
pub const MAX_PAYLOAD_LEN: usize = 16 * 1024;

/// What a JWT header holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading<'a> {
    /// No token at all: a bearer header without a `.` (another scheme, such as `Basic`).
    NoToken,
    /// A token or payload that cannot be read (malformed, not base64url, not a JSON object).
    Unreadable,
    /// A payload longer than `MAX_PAYLOAD_LEN`, as sent (without its padding).
    TooLong(&'a [u8]),
    /// The claim as text: a string as it is, anything else (a number, `true`, an array, an
    /// object) as the token writes it; `None` when the payload lacks it or it is `null`.
    Claim(Option<String>),
}

/// Reads `claim` from `raw`, the header's value trimmed.
pub fn read<'a>(raw: &'a [u8], claim: &str, unverified: bool) -> Reading<'a> {
    let payload = match unverified {
        true if !raw.contains(&b'.') => return Reading::NoToken,
        true => match payload_of_token(raw) {
            Some(payload) => payload,
            None => return Reading::Unreadable,
        },
        false => raw,
    };
    let unpadded = payload.len() - payload.iter().rev().take_while(|&&b| b == b'=').count();
    let payload = payload.get(..unpadded).unwrap_or_default();
    if payload.len() > MAX_PAYLOAD_LEN {
        return Reading::TooLong(payload);
    }
    let Some(json) = base64url_decode(payload) else {
        return Reading::Unreadable;
    };
    let mut reader = serde_json::Deserializer::from_slice(&json);
    let found = match ClaimOf(claim).deserialize(&mut reader) {
        Ok(found) if reader.end().is_ok() => found,
        _ => return Reading::Unreadable,
    };
    Reading::Claim(match found.as_deref().map(RawValue::get) {
        None | Some("null") => None,
        Some(text) if text.starts_with('"') => match serde_json::from_str(text) {
            Ok(string) => Some(string),
            Err(_) => return Reading::Unreadable,
        },
        Some(text) => Some(text.to_string()),
    })
}

/// Reads a JSON object, keeping only the value of one member, as written (the last one, if
/// the name comes twice); the others are read through, never built.
struct ClaimOf<'c>(&'c str);

impl<'de> DeserializeSeed<'de> for ClaimOf<'_> {
    type Value = Option<Box<RawValue>>;

    fn deserialize<D: Deserializer<'de>>(self, reader: D) -> Result<Self::Value, D::Error> {
        reader.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ClaimOf<'_> {
    type Value = Option<Box<RawValue>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut members: M) -> Result<Self::Value, M::Error> {
        let mut found = None;
        while let Some(name) = members.next_key::<String>()? {
            if name == self.0 {
                found = Some(members.next_value()?);
            } else {
                members.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// The middle segment of `[anything]header.payload.signature[anything]`: exactly two dots.
fn payload_of_token(raw: &[u8]) -> Option<&[u8]> {
    let mut parts = raw.split(|&b| b == b'.');
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

    fn claim<'a>(raw: &'a str, claim: &str, unverified: bool) -> Reading<'a> {
        read(raw.as_bytes(), claim, unverified)
    }

    fn value(text: &str) -> Reading<'static> {
        Reading::Claim(Some(text.into()))
    }

    #[test]
    fn forwarded_payload_gives_every_claim_as_text() {
        let payload =
            b64(br#"{"sub":"alice","uid":42,"admin":true,"groups":["a","b"],"none":null}"#);
        assert_eq!(claim(&payload, "sub", false), value("alice"));
        assert_eq!(claim(&payload, "uid", false), value("42"));
        assert_eq!(claim(&payload, "admin", false), value("true"));
        assert_eq!(claim(&payload, "groups", false), value(r#"["a","b"]"#));
        assert_eq!(claim(&payload, "none", false), Reading::Claim(None));
        assert_eq!(claim(&payload, "missing", false), Reading::Claim(None));
    }

    #[test]
    fn bearer_token_is_read_only_when_unverified_is_allowed() {
        let token = format!("Bearer e30.{}.c2ln", b64(br#"{"sub":"bob"}"#));
        assert_eq!(claim(&token, "sub", true), value("bob"));
        // As a forwarded payload the whole token is not base64: unreadable.
        assert_eq!(claim(&token, "sub", false), Reading::Unreadable);
    }

    #[test]
    fn whatever_surrounds_the_three_segments_is_not_read() {
        let p = b64(br#"{"sub":"bob"}"#);
        for token in [
            format!("Bearer{}e30.{p}.c2ln", " ".repeat(10_000)),
            format!("Bearer !!e30.{p}.c2ln!!"),
            format!("{} Bearer e30.{p}.c2ln", "x".repeat(10_000)),
            format!("Bearer e30.{p}.c2ln{}", "=".repeat(10_000)),
            format!("Bearer e30.{p}{}.c2ln", "=".repeat(10_000)),
            format!("e30.{p}.c2ln"),
        ] {
            assert_eq!(claim(&token, "sub", true), value("bob"), "{token:.40}");
        }
    }

    #[test]
    fn malformed_tokens_are_unreadable_and_other_schemes_hold_none() {
        let p = b64(br#"{"sub":"bob"}"#);
        for bad in [
            format!("Bearer {p}.c"),
            format!("Bearer a.{p}.c.d"),
            format!("Bearer a.{}.c", b64(b"[1,2]")),
            format!("Bearer a.{}.c", b64(b"{not json")),
            format!("Bearer a.{p}=x.c"),
            "Bearer a..c".into(),
        ] {
            assert_eq!(claim(&bad, "sub", true), Reading::Unreadable, "{bad}");
        }
        for other in ["Bearer", "Bearer abc", "Basic dXNlcjpwYXNz"] {
            assert_eq!(claim(other, "sub", true), Reading::NoToken, "{other}");
        }
        assert_eq!(claim("!!", "sub", false), Reading::Unreadable);
    }

    #[test]
    fn a_payload_too_long_to_decode_is_handed_back_unpadded() {
        let long = "A".repeat(MAX_PAYLOAD_LEN + 1);
        let token = format!("Bearer a.{long}==.c");
        assert_eq!(
            claim(&token, "sub", true),
            Reading::TooLong(long.as_bytes())
        );
        assert_eq!(
            claim(&long, "sub", false),
            Reading::TooLong(long.as_bytes())
        );
        // Padding does not make a payload long.
        let p = b64(br#"{"sub":"bob"}"#);
        let padded = format!("{p}{}", "=".repeat(MAX_PAYLOAD_LEN));
        assert_eq!(claim(&padded, "sub", false), value("bob"));
    }
}
