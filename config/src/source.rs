//! The `identity` section of the configuration: where each identity's value comes from,
//! and whether the client can choose it.
//!
//! Trust is decided here, at load: a value a client can write itself (a plain header, an
//! unverified JWT) must never pick a client's tier, and IPv6 clients are keyed on a prefix
//! so that rotating addresses inside one allocation does not dodge per-IP rules.

use crate::body_field::field_path;
use crate::error::{err, ConfigError};
use serde::Deserialize;

/// The prefix IPv6 clients are keyed on by default: the /64 a single site or subscriber
/// usually holds (RFC 6177), inside which a client can pick any of 2^64 addresses.
const DEFAULT_IPV6_PREFIX: u8 = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdentity {
    header: Option<String>,
    jwt: Option<RawJwt>,
    body: Option<String>,
    source: Option<IpSourceKind>,
    trusted_hops: Option<u32>,
    gateway_appends: Option<bool>,
    ipv6_prefix: Option<u8>,
    trusted: Option<bool>,
    missing: Option<Missing>,
}

/// What a rule does with a request that lacks one of the identities of its key.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug, Default)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// The rule does not apply to the request (it has no bucket to check).
    #[default]
    Skip,
    /// The request is refused: a client must not escape a limit by leaving its key out.
    Deny,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJwt {
    header: String,
    #[serde(default = "default_claim")]
    claim: String,
    #[serde(default)]
    unverified: bool,
}

fn default_claim() -> String {
    "sub".into()
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum IpSourceKind {
    Peer,
    Xff,
}

/// Where an identity's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A request header, taken as is (e.g. set by an auth filter).
    Header(String),
    /// A claim of a JWT payload. With `unverified == false` the header holds the payload
    /// already verified by Envoy's `jwt_authn` (`forward_payload_header`); with `true`
    /// it holds the bearer token itself, whose signature nobody checked.
    Jwt {
        header: String,
        claim: String,
        unverified: bool,
    },
    /// A string field of the request's JSON body (an LLM request's `model`), by its path
    /// from the root, read only when a rule that applies needs it.
    Body(Vec<String>),
    /// The client's address: the downstream peer (`source.address`, which honours
    /// Envoy's trusted hops) or, with `forwarded`, `X-Forwarded-For`.
    Address(Address),
}

/// How a client's address is found and keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// `None`: the peer. `Some`: the address written by the outermost of `hops` trusted
    /// proxies in front of the gateway, falling back to the peer.
    pub forwarded: Option<Forwarded>,
    /// IPv6 clients are keyed on their first `ipv6_prefix` bits (IPv4 on the whole address).
    pub ipv6_prefix: u8,
}

/// Which `X-Forwarded-For` entry holds the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    pub hops: u32,
    /// The gateway itself appended an entry before the filter runs (Envoy's
    /// `use_remote_address: true`), which is not a hop.
    pub gateway_appends: bool,
}

/// A named way to identify the client; rules refer to identities by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub source: Source,
    /// The client cannot choose the value (an address, a verified claim, or a header the
    /// configuration says an upstream filter sets): only such a value may select a tier.
    pub trusted: bool,
    /// What a rule keyed on this identity does when a request lacks it (unless the rule
    /// says otherwise).
    pub missing: Missing,
}

impl Source {
    /// Where the value comes from, in words for a client: `the x-api-key header`.
    pub fn described(&self) -> String {
        match self {
            Source::Header(name) => format!("the {name} header"),
            Source::Jwt { header, claim, .. } => {
                format!("the claim {claim:?} of a JWT in the {header} header")
            }
            Source::Body(path) => format!("the field {:?} of its JSON body", path.join(".")),
            Source::Address(_) => "the client's address".into(),
        }
    }
}

impl RawIdentity {
    pub(crate) fn validate(self, name: String, field: &str) -> Result<Identity, ConfigError> {
        let only = |option: &str, applies: &str| {
            err(
                format!("{field}.{option}"),
                format!("only applies to {applies}"),
            )
        };
        let xff = self.source == Some(IpSourceKind::Xff);
        if !xff && self.trusted_hops.is_some() {
            return only("trusted_hops", "\"source\": \"xff\"");
        }
        if !xff && self.gateway_appends.is_some() {
            return only("gateway_appends", "\"source\": \"xff\"");
        }
        if self.source.is_none() && self.ipv6_prefix.is_some() {
            return only("ipv6_prefix", "\"source\": \"peer\" or \"xff\"");
        }
        if self.source.is_some() && self.missing.is_some() {
            return only(
                "missing",
                "a header, a JWT or a body field (a request always has an address)",
            );
        }
        let (source, trusted) =
            match (self.header, self.jwt, self.body, self.source) {
                (Some(header), None, None, None) => (
                    Source::Header(validate_header_name(&format!("{field}.header"), &header)?),
                    self.trusted.unwrap_or(false),
                ),
                (None, Some(jwt), None, None) => {
                    if jwt.claim.is_empty() {
                        return err(format!("{field}.jwt.claim"), "must name a claim");
                    }
                    if !jwt.unverified && self.trusted.is_some() {
                        return only(
                            "trusted",
                            "a header, a body field or an unverified JWT (a verified claim is trusted)",
                        );
                    }
                    let trusted = !jwt.unverified || self.trusted.unwrap_or(false);
                    let header = validate_header_name(&format!("{field}.jwt.header"), &jwt.header)?;
                    let source = Source::Jwt {
                        header,
                        claim: jwt.claim,
                        unverified: jwt.unverified,
                    };
                    (source, trusted)
                }
                // The client writes its body: trusted (to pick a tier) only where the operator
                // says the value names what the upstream serves and bills (a model), so that
                // choosing it is choosing its price.
                (None, None, Some(body), None) => (
                    Source::Body(field_path(&format!("{field}.body"), &body)?),
                    self.trusted.unwrap_or(false),
                ),
                (None, None, None, Some(kind)) => {
                    if self.trusted.is_some() {
                        return only(
                            "trusted",
                            "a header, a body field or an unverified JWT (an address is trusted)",
                        );
                    }
                    let ipv6_prefix = self.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
                    if !(1..=128).contains(&ipv6_prefix) {
                        return err(format!("{field}.ipv6_prefix"), "must be between 1 and 128");
                    }
                    let forwarded = match kind {
                        IpSourceKind::Peer => None,
                        IpSourceKind::Xff => {
                            Some(forwarded(self.trusted_hops, self.gateway_appends, field)?)
                        }
                    };
                    let address = Address {
                        forwarded,
                        ipv6_prefix,
                    };
                    (Source::Address(address), true)
                }
                _ => return err(
                    field,
                    "needs exactly one of \"header\", \"jwt\", \"body\" or \"source\" (\"peer\" or \"xff\")",
                ),
            };
        Ok(Identity {
            name,
            source,
            trusted,
            missing: self.missing.unwrap_or_default(),
        })
    }
}

fn forwarded(
    trusted_hops: Option<u32>,
    gateway_appends: Option<bool>,
    field: &str,
) -> Result<Forwarded, ConfigError> {
    let hops = trusted_hops.unwrap_or(1);
    if hops == 0 {
        return err(
            format!("{field}.trusted_hops"),
            "must be at least 1 (0 would trust the client's own header)",
        );
    }
    Ok(Forwarded {
        hops,
        gateway_appends: gateway_appends.unwrap_or(true),
    })
}

/// A header name as the configuration names one (`identity`, `method_override`): a valid
/// token, lower-cased.
pub(crate) fn validate_header_name(field: &str, name: &str) -> Result<String, ConfigError> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b));
    if !valid {
        return err(field, format!("{name:?} is not a valid header name"));
    }
    // Envoy hands headers to wasm with lower-case names.
    Ok(name.to_ascii_lowercase())
}
