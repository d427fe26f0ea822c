//! Where the bridge is and how checks travel to it: the `backend` section of the plugin
//! configuration.

use crate::config_error::{err, ConfigError};
use serde::Deserialize;

/// Most exchanges a worker may keep in flight.
pub const MAX_INFLIGHT: u32 = 64;
/// Longest `timeout_ms`: no answer comes later than this.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// How checks reach the bridge.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One long-lived gRPC stream per worker; a check is a message on it. The cheapest for
    /// the gateway: no new upstream stream per exchange.
    #[default]
    Grpc,
    /// One HTTP callout (`POST /v1/check`) per exchange, for hosts without gRPC streams
    /// (Kong's ngx_wasm_module dispatches HTTP/1.1 only).
    Http,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    cluster: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    authority: Option<String>,
    #[serde(default)]
    transport: Transport,
    #[serde(default = "default_max_inflight")]
    max_inflight: u32,
    token: Option<String>,
}

/// Longest `backend.token`.
const MAX_TOKEN_LEN: usize = 4096;

fn default_timeout_ms() -> u64 {
    25
}

/// One exchange out at a time: under load every check that arrives meanwhile joins the
/// next one, which measured best here (fewest exchanges per request, so the least gateway
/// CPU, at 16 and 64 requests in flight; see bench/REPORT.md).
fn default_max_inflight() -> u32 {
    1
}

/// Where the bridge lives, how checks get there and how long one may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Envoy cluster name (or `host:port` on Kong) of the bridge.
    pub cluster: String,
    /// `:authority` of HTTP callouts; Envoy routes on the cluster, but HTTP/2 needs one.
    pub authority: String,
    /// Past this an exchange is abandoned and the failure mode applies to its checks.
    pub timeout_ms: u64,
    pub transport: Transport,
    /// Group commit: exchanges a worker keeps in flight. Checks that arrive while that
    /// many are out wait and leave together, in one exchange, the moment one comes back.
    /// 0: no limit, every check is its own exchange.
    pub max_inflight: u32,
    /// `Bearer <backend.token>`, the `authorization` the bridge requires when it has a
    /// token file: sent on every HTTP callout and as the stream's initial metadata.
    pub authorization: Option<Secret>,
}

/// A credential: kept out of `Debug` output, so no log line or error message carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The `authorization` value for `token`. RFC 6750's token characters only: anything else
/// (spaces, control characters, a line break) could forge or split a header.
fn bearer(token: &str) -> Result<Secret, ConfigError> {
    let valid = token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
    if token.is_empty() || token.len() > MAX_TOKEN_LEN || !valid {
        return err(
            "backend.token",
            format!(
                "must be 1 to {MAX_TOKEN_LEN} characters of letters, digits and -._~+/= (the value is not shown)"
            ),
        );
    }
    Ok(Secret(format!("Bearer {token}")))
}

impl RawBackend {
    pub(crate) fn validate(self) -> Result<Backend, ConfigError> {
        if self.cluster.is_empty() {
            return err("backend.cluster", "must name the bridge's cluster");
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return err(
                "backend.timeout_ms",
                format!("must be between 1 and {MAX_TIMEOUT_MS}"),
            );
        }
        if self.max_inflight > MAX_INFLIGHT {
            return err(
                "backend.max_inflight",
                format!("must be between 0 and {MAX_INFLIGHT}"),
            );
        }
        let authorization = self.token.as_deref().map(bearer).transpose()?;
        Ok(Backend {
            authorization,
            authority: self.authority.unwrap_or_else(|| self.cluster.clone()),
            cluster: self.cluster,
            timeout_ms: self.timeout_ms,
            transport: self.transport,
            max_inflight: self.max_inflight,
        })
    }
}
