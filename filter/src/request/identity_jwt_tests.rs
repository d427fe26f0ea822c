//! JWT identities with hostile tokens: a token present in the request either gives its
//! claim, or refuses the request (`BadIdentity`); it never reads as absent, which would
//! exempt the request from its rules.

use super::tests::{header, resolve};
use super::*;
use crate::fakes::FakeRequest;

/// {"sub":"carol","tier":"premium"}
const PAYLOAD: &str = "eyJzdWIiOiJjYXJvbCIsInRpZXIiOiJwcmVtaXVtIn0";

fn bearer(claim: &str) -> Source {
    Source::Jwt {
        header: "authorization".into(),
        claim: claim.into(),
        unverified: true,
    }
}

fn verified() -> Source {
    Source::Jwt {
        header: "x-jwt-payload".into(),
        claim: "sub".into(),
        unverified: false,
    }
}

fn with_token(token: impl AsRef<[u8]>) -> FakeRequest {
    FakeRequest::default().with("authorization", token)
}

fn refusal(source: &Source, req: &FakeRequest) -> Option<Problem> {
    super::resolve(source, req).err().map(|bad| bad.problem)
}

#[test]
fn jwt_claims_are_read() {
    let req = FakeRequest::default().with("x-jwt-payload", PAYLOAD);
    assert_eq!(resolve(&verified(), &req).as_deref(), Some("carol"));
    let req = with_token(format!("Bearer x.{PAYLOAD}.y"));
    assert_eq!(resolve(&bearer("tier"), &req).as_deref(), Some("premium"));
    // A claim the token lacks is an identity the request lacks.
    assert_eq!(resolve(&bearer("org"), &req), None);
    // No bearer token at all (another scheme): nothing to read either.
    for other in ["Basic dXNlcjpwYXNz", "Bearer", "  "] {
        assert_eq!(resolve(&bearer("sub"), &with_token(other)), None, "{other}");
    }
}

#[test]
fn a_padded_token_is_read_whatever_its_length() {
    // What Envoy's jwt_authn accepts around a valid token, each far over 8 KiB.
    let token = format!("x.{PAYLOAD}.y");
    for padded in [
        format!("Bearer{}{token}", " ".repeat(8200)),
        format!("Bearer {}{token}{}", "\t ".repeat(4100), " ".repeat(100)),
        format!("Bearer {}{token}", "!".repeat(8200)),
        format!("{} Bearer {token}", "x".repeat(8200)),
        format!("Bearer {token}{}", "=".repeat(8200)),
        format!("Bearer x.{PAYLOAD}{}.y", "=".repeat(8200)),
    ] {
        let req = with_token(&padded);
        assert_eq!(
            resolve(&bearer("sub"), &req).as_deref(),
            Some("carol"),
            "{padded:.30}"
        );
    }
    let padded = format!("{PAYLOAD}{}", "=".repeat(8200));
    let req = FakeRequest::default().with("x-jwt-payload", padded);
    assert_eq!(resolve(&verified(), &req).as_deref(), Some("carol"));
}

#[test]
fn a_present_but_unreadable_token_refuses_the_request() {
    for bad in [
        "Bearer a.b".to_string(),
        "Bearer !!.??.##".into(),
        format!("Bearer x.{PAYLOAD}.y.z"),
        format!("Bearer x.!{PAYLOAD}.y"),
        "Bearer a.W10.c".into(), // [] is no object
        "Bearer a..c".into(),
    ] {
        assert_eq!(
            refusal(&bearer("sub"), &with_token(&bad)),
            Some(Problem::Unreadable),
            "{bad}"
        );
    }
    for bad in ["!!", "e30.e30", &format!("{PAYLOAD}x")] {
        let req = FakeRequest::default().with("x-jwt-payload", bad);
        assert_eq!(
            refusal(&verified(), &req),
            Some(Problem::Unreadable),
            "{bad}"
        );
    }
}

#[test]
fn a_payload_too_long_to_decode_is_keyed_on_its_digest() {
    let long = "A".repeat(jwt::MAX_PAYLOAD_LEN + 1);
    let value = resolve(&bearer("sub"), &with_token(format!("Bearer x.{long}.y"))).unwrap();
    assert_eq!(value, escape(long.as_bytes()));
    assert!(value.starts_with('#') && value.len() == 65, "{value}");
    let other = format!("Bearer x.{long}B.y");
    assert_ne!(resolve(&bearer("sub"), &with_token(other)), Some(value));
}

#[test]
fn claims_of_any_type_are_keyed_on_their_text() {
    // {"sub":{"id":7},"n":1.5,"ok":false,"none":null}
    let payload = "eyJzdWIiOnsiaWQiOjd9LCJuIjoxLjUsIm9rIjpmYWxzZSwibm9uZSI6bnVsbH0";
    let req = with_token(format!("Bearer x.{payload}.y"));
    let claim = |name| resolve(&bearer(name), &req);
    assert_eq!(claim("sub").as_deref(), Some("%7B%22id%22%3A7%7D"));
    assert_eq!(claim("n").as_deref(), Some("1.5"));
    assert_eq!(claim("ok").as_deref(), Some("false"));
    assert_eq!(claim("none"), None);
}

#[test]
fn a_repeated_identity_header_cannot_be_resolved() {
    let req = FakeRequest::default()
        .with("x-user-id", "victim")
        .twice("x-user-id");
    let repeated = Err(BadIdentity {
        at: Place::Header("x-user-id".into()),
        problem: Problem::Repeated,
    });
    assert_eq!(super::resolve(&header("x-user-id"), &req), repeated);
    let jwt = Source::Jwt {
        header: "x-user-id".into(),
        claim: "sub".into(),
        unverified: false,
    };
    assert_eq!(super::resolve(&jwt, &req), repeated);
    let other = FakeRequest::default()
        .with("x-user-id", "alice")
        .twice("x-other");
    assert_eq!(
        resolve(&header("x-user-id"), &other).as_deref(),
        Some("alice")
    );
}

#[test]
fn a_jwt_header_whose_copies_a_proxy_joined_is_repeated() {
    // Envoy joins the copies of `authorization` into one value: no token holds a comma.
    let token = format!("Bearer x.{PAYLOAD}.y");
    for joined in [
        format!("{token},{token}"),
        format!("{token}, Bearer garbage"),
        format!("Basic dXNlcjpwYXNz, {token}"),
        "Basic a,Basic b".into(),
    ] {
        assert_eq!(
            refusal(&bearer("sub"), &with_token(&joined)),
            Some(Problem::Repeated),
            "{joined}"
        );
    }
    let joined = FakeRequest::default().with("x-jwt-payload", format!("{PAYLOAD},{PAYLOAD}"));
    assert_eq!(refusal(&verified(), &joined), Some(Problem::Repeated));
    // A plain header's comma is its value's: a user agent holds one.
    let agent = FakeRequest::default().with("user-agent", "Mozilla/5.0 (KHTML, like Gecko)");
    assert_eq!(
        resolve(&header("user-agent"), &agent).as_deref(),
        Some("Mozilla%2F5.0%20%28KHTML%2C%20like%20Gecko%29")
    );
}
