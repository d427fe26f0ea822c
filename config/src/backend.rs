//! Where the checks go and how they travel: the `backend` section of the plugin
//! configuration. Either the bridge (`cluster`, over gRPC or HTTP) or, in the redis-call
//! build for Higress, Redis itself (`redis`); one build speaks to one of them.

use crate::error::{err, ConfigError};
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
    /// Higress's redis call: the filter runs the token bucket script on Redis itself
    /// (`backend.redis`, the redis-call build only). Not a value of `backend.transport`.
    #[serde(skip_deserializing)]
    Redis,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    // Absent, not null: `Option` only to tell whether the field was given (see `present`).
    #[serde(default, deserialize_with = "present")]
    cluster: Option<String>,
    #[serde(default, deserialize_with = "present")]
    timeout_ms: Option<u64>,
    authority: Option<String>,
    #[serde(default, deserialize_with = "present")]
    transport: Option<Transport>,
    #[serde(default = "default_max_inflight")]
    max_inflight: u32,
    token: Option<String>,
    #[serde(default, deserialize_with = "present")]
    redis: Option<RawRedis>,
}

/// A field that may be left out but, when given, must hold a value (null is refused).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `backend.redis`: the Redis service Higress knows, and how to log in to it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    cluster: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    username: Option<String>,
    password: Option<String>,
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
    /// What `proxy_redis_init` logs in with (transport `Redis` only; `None` for a Redis
    /// without AUTH).
    pub login: Option<RedisLogin>,
}

/// A Redis ACL user (empty: the default user) and its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisLogin {
    pub username: String,
    pub password: Secret,
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

fn validate_timeout(field: &str, timeout_ms: u64) -> Result<(), ConfigError> {
    if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        return err(field, format!("must be between 1 and {MAX_TIMEOUT_MS}"));
    }
    Ok(())
}

impl RawBackend {
    pub(crate) fn validate(mut self) -> Result<Backend, ConfigError> {
        if self.max_inflight > MAX_INFLIGHT {
            return err(
                "backend.max_inflight",
                format!("must be between 0 and {MAX_INFLIGHT}"),
            );
        }
        match self.redis.take() {
            Some(redis) => self.validate_redis(redis),
            None => self.validate_bridge(),
        }
    }

    fn validate_bridge(self) -> Result<Backend, ConfigError> {
        let Some(cluster) = self.cluster.filter(|c| !c.is_empty()) else {
            return err(
                "backend.cluster",
                "must name the bridge's cluster (or use backend.redis with ratelimit-redis.wasm)",
            );
        };
        let timeout_ms = self.timeout_ms.unwrap_or_else(default_timeout_ms);
        validate_timeout("backend.timeout_ms", timeout_ms)?;
        let authorization = self.token.as_deref().map(bearer).transpose()?;
        Ok(Backend {
            authorization,
            authority: self.authority.unwrap_or_else(|| cluster.clone()),
            cluster,
            timeout_ms,
            transport: self.transport.unwrap_or_default(),
            max_inflight: self.max_inflight,
            login: None,
        })
    }

    /// `backend.redis`: the bridge's own fields have no meaning beside it.
    fn validate_redis(self, redis: RawRedis) -> Result<Backend, ConfigError> {
        let bridge_only = [
            ("cluster", self.cluster.is_some()),
            ("timeout_ms", self.timeout_ms.is_some()),
            ("authority", self.authority.is_some()),
            ("transport", self.transport.is_some()),
            ("token", self.token.is_some()),
        ];
        if let Some((field, _)) = bridge_only.iter().find(|(_, given)| *given) {
            return err(
                format!("backend.{field}"),
                "belongs to the bridge; a backend.redis takes its own cluster and timeout_ms",
            );
        }
        if redis.cluster.is_empty() {
            return err(
                "backend.redis.cluster",
                "must name the Redis service's cluster",
            );
        }
        validate_timeout("backend.redis.timeout_ms", redis.timeout_ms)?;
        let login = match (redis.username, redis.password) {
            (username, Some(password)) => {
                for (field, value) in [
                    ("username", username.as_deref()),
                    ("password", Some(&password)),
                ] {
                    if value.is_some_and(|v| v.is_empty() || v.len() > MAX_TOKEN_LEN) {
                        return err(
                            format!("backend.redis.{field}"),
                            format!("must be 1 to {MAX_TOKEN_LEN} bytes (the value is not shown)"),
                        );
                    }
                }
                Some(RedisLogin {
                    username: username.unwrap_or_default(),
                    password: Secret(password),
                })
            }
            (Some(_), None) => return err("backend.redis.password", "a username needs a password"),
            (None, None) => None,
        };
        Ok(Backend {
            authority: redis.cluster.clone(),
            cluster: redis.cluster,
            timeout_ms: redis.timeout_ms,
            transport: Transport::Redis,
            max_inflight: self.max_inflight,
            authorization: None,
            login,
        })
    }
}

impl Backend {
    /// Refuses a backend this build cannot reach: the default build has no redis call
    /// (stock Envoy refuses a module that imports one), the redis-call build no bridge
    /// transport.
    pub fn validate_build(&self, redis_call_build: bool) -> Result<(), ConfigError> {
        match (self.transport == Transport::Redis, redis_call_build) {
            (true, false) => err(
                "backend.redis",
                "this build talks to the bridge; use ratelimit-redis.wasm (Higress) for backend.redis",
            ),
            (false, true) => err(
                "backend.cluster",
                "this build (ratelimit-redis.wasm) talks to Redis; use backend.redis, or ratelimit.wasm for the bridge",
            ),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::Transport;
    use crate::config::Config;
    use crate::error::ConfigError;

    fn parse(backend: &str) -> Result<Config, ConfigError> {
        let json = format!(
            r#"{{"backend": {backend}, "rules": [{{"name": "r", "key": [], "limit": {{"requests": 1, "per": "1s"}}}}]}}"#
        );
        Config::parse(json.as_bytes())
    }

    #[test]
    fn a_redis_backend_names_the_service_and_logs_in_secretly() {
        let c = parse(
            r#"{"redis": {"cluster": "outbound|6379||redis.default.svc.cluster.local",
                "username": "rl", "password": "s3cret"}, "max_inflight": 4}"#,
        )
        .unwrap();
        let b = &c.backend;
        assert_eq!(b.transport, Transport::Redis);
        assert_eq!(b.cluster, "outbound|6379||redis.default.svc.cluster.local");
        assert_eq!((b.timeout_ms, b.max_inflight), (25, 4));
        let login = b.login.as_ref().unwrap();
        assert_eq!(
            (login.username.as_str(), login.password.expose()),
            ("rl", "s3cret")
        );
        assert!(!format!("{b:?}").contains("s3cret"), "never in Debug");
        assert!(b.validate_build(true).is_ok());
        let e = b.validate_build(false).unwrap_err();
        assert_eq!(e.field, "backend.redis");
        assert!(e.problem.contains("ratelimit-redis.wasm"), "{e}");
        let bridge = parse(r#"{"cluster": "b"}"#).unwrap().backend;
        assert!(bridge.validate_build(false).is_ok());
        assert!(bridge.validate_build(true).is_err());
        let password_only = parse(r#"{"redis": {"cluster": "r", "password": "p"}}"#).unwrap();
        assert_eq!(password_only.backend.login.unwrap().username, "");
    }

    #[test]
    fn a_redis_backend_is_refused_at_the_field_at_fault() {
        let cases = [
            (r#"{}"#, "backend.cluster"),
            (r#"{"redis": {"cluster": ""}}"#, "backend.redis.cluster"),
            (r#"{"redis": {}}"#, "backend.redis"),
            (
                r#"{"redis": {"cluster": "r", "timeout_ms": 0}}"#,
                "backend.redis.timeout_ms",
            ),
            (
                r#"{"redis": {"cluster": "r", "username": "u"}}"#,
                "backend.redis.password",
            ),
            (
                r#"{"redis": {"cluster": "r", "password": ""}}"#,
                "backend.redis.password",
            ),
            (r#"{"redis": {"cluster": "r", "db": 1}}"#, "backend.redis"),
            (
                r#"{"cluster": "b", "redis": {"cluster": "r"}}"#,
                "backend.cluster",
            ),
            (
                r#"{"redis": {"cluster": "r"}, "transport": "http"}"#,
                "backend.transport",
            ),
            (
                r#"{"redis": {"cluster": "r"}, "timeout_ms": 5}"#,
                "backend.timeout_ms",
            ),
            (
                r#"{"redis": {"cluster": "r"}, "token": "t"}"#,
                "backend.token",
            ),
            (
                r#"{"cluster": "b", "transport": "redis"}"#,
                "backend.transport",
            ),
        ];
        let higress_rules = r#"{"backend": {"redis": {"cluster": "r"}}, "rules": [],
            "_rules_": [{"_match_route_": ["a"], "rules": []}]}"#;
        let e = Config::parse(higress_rules.as_bytes()).unwrap_err();
        assert_eq!(e.field, "_rules_[0].rules");
        for (backend, field) in cases {
            let e = parse(backend)
                .err()
                .unwrap_or_else(|| panic!("{backend} accepted"));
            assert!(e.field.starts_with(field), "{backend}: {e}");
        }
    }
}
