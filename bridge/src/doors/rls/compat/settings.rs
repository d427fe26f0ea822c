//! envoyproxy/ratelimit's settings that are not text (its `src/settings/settings.go`), each
//! with the Go type envconfig reads it as. That service reads them all at start and
//! refuses to start on any it cannot read, set or not used: a deployment the bridge starts
//! from is one that service would have started from, and no variable means one thing
//! there and another here. Text settings (paths, addresses, names) are taken as they are,
//! as envconfig takes them.

use super::go;

/// A Go type envconfig reads a variable as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoType {
    Bool,
    /// `int` (64 bits where that service runs) or `int64`: `strconv.ParseInt(v, 0, 64)`.
    Int,
    /// `float32` or `float64`: `strconv.ParseFloat(v, bits)`.
    Float(u32),
    /// `time.Duration`: `time.ParseDuration`.
    Duration,
    /// `map[string]string`: `key:value` pairs, comma-separated.
    Map,
}

/// Every setting of envoyproxy/ratelimit that is not text or a list of text, by the name
/// of its variable (as of its `main` in 2026).
pub const SETTINGS: &[(&str, GoType)] = {
    use GoType::{Bool, Duration, Float, Int, Map};
    &[
        ("PORT", Int),
        ("DEBUG_PORT", Int),
        ("GRPC_PORT", Int),
        ("GRPC_MAX_CONNECTION_AGE", Duration),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", Duration),
        ("GRPC_SERVER_USE_TLS", Bool),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", Bool),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Duration),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Map),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Bool),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Duration),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Duration),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Float(64)),
        ("XDS_CLIENT_BACKOFF_JITTER", Bool),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Int),
        ("USE_DOG_STATSD", Bool),
        ("USE_STATSD", Bool),
        ("STATSD_PORT", Int),
        ("EXTRA_TAGS", Map),
        ("STATS_FLUSH_INTERVAL", Duration),
        ("DISABLE_STATS", Bool),
        ("USE_PROMETHEUS", Bool),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Bool),
        ("RUNTIME_IGNOREDOTFILES", Bool),
        ("RUNTIME_WATCH_ROOT", Bool),
        ("EXPIRATION_JITTER_MAX_SECONDS", Int),
        ("LOCAL_CACHE_SIZE_IN_BYTES", Int),
        ("NEAR_LIMIT_RATIO", Float(32)),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Bool),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", Bool),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Bool),
        ("REDIS_POOL_SIZE", Int),
        ("REDIS_TLS", Bool),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Bool),
        ("REDIS_PIPELINE_WINDOW", Duration),
        ("REDIS_PIPELINE_LIMIT", Int),
        ("REDIS_CLUSTER_PIPELINE_PARALLELISM", Int),
        ("REDIS_PERSECOND", Bool),
        ("REDIS_PERSECOND_POOL_SIZE", Int),
        ("REDIS_PERSECOND_TLS", Bool),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", Duration),
        ("REDIS_PERSECOND_PIPELINE_LIMIT", Int),
        ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Int),
        ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Bool),
        ("REDIS_TIMEOUT", Duration),
        ("REDIS_PERSECOND_TIMEOUT", Duration),
        ("REDIS_STARTUP_INITIAL_INTERVAL", Duration),
        ("REDIS_STARTUP_MAX_INTERVAL", Duration),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", Duration),
        ("MEMCACHE_MAX_IDLE_CONNS", Int),
        ("MEMCACHE_SRV_REFRESH", Duration),
        ("MEMCACHE_TLS", Bool),
        ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Bool),
        ("SHADOW_MODE", Bool),
        ("QUOTA_MODE", Bool),
        ("RESPONSE_DYNAMIC_METADATA", Bool),
        ("MERGE_DOMAIN_CONFIG", Bool),
        ("TRACING_ENABLED", Bool),
        ("TRACING_SAMPLING_RATE", Float(64)),
    ]
};

/// Why `value` of `name` is no value of its Go type `kind`.
fn refusal(name: &str, value: &str, kind: GoType) -> Option<String> {
    let why = match kind {
        GoType::Bool => go::parse_bool(value).err(),
        GoType::Int => go::parse_int(value, 64).err(),
        GoType::Float(bits) => go::parse_float(value, bits).err(),
        GoType::Duration => go::parse_duration(value).err(),
        GoType::Map => go::parse_map(value).err(),
    }?;
    Some(format!(
        "{name}={value:?}: {why}; envoyproxy/ratelimit refuses to start on it, and so does \
         the bridge"
    ))
}

/// Every setting `get` gives that envoyproxy/ratelimit would refuse, read as envconfig
/// reads it: a variable set, even empty, is parsed; one not set takes its default.
pub fn check(get: &impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let refused: Vec<String> = SETTINGS
        .iter()
        .filter_map(|&(name, kind)| refusal(name, &get(name)?, kind))
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(refused.join("\n"))
    }
}

/// A boolean setting, `default` where it is not set.
pub fn boolean(get: &impl Fn(&str) -> Option<String>, name: &str, default: bool) -> bool {
    get(name).map_or(default, |v| go::parse_bool(&v).unwrap_or(default))
}

/// An integer setting, `default` where it is not set, written in decimal (`0x1F91` is
/// port 8081 to Go).
pub fn integer(get: &impl Fn(&str) -> Option<String>, name: &str, default: i64) -> String {
    get(name)
        .map_or(default, |v| go::parse_int(&v, 64).unwrap_or(default))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        move |name| vars.get(name).map(|v| (*v).to_owned())
    }

    #[test]
    fn every_setting_is_read_by_its_go_type_and_named_when_refused() {
        let good = env(&[
            ("GRPC_SERVER_USE_TLS", "T"),
            ("GRPC_PORT", "0x1F91"),
            ("REDIS_TIMEOUT", "1m30s"),
            ("NEAR_LIMIT_RATIO", "0.8"),
            ("EXTRA_TAGS", "a:b,c:d"),
            ("LOG_LEVEL", "anything: text is text"),
        ]);
        assert_eq!(check(&good), Ok(()));
        assert!(boolean(&good, "GRPC_SERVER_USE_TLS", false));
        assert_eq!(integer(&good, "GRPC_PORT", 8081), "8081");
        assert_eq!(integer(&good, "PORT", 8080), "8080");
        for (name, value) in [
            ("GRPC_SERVER_USE_TLS", "yes"),
            ("REDIS_TLS", ""),
            ("USE_STATSD", "on"),
            ("PORT", "8080 "),
            ("GRPC_PORT", "08081"),
            ("REDIS_TIMEOUT", "10"),
            ("NEAR_LIMIT_RATIO", "1e39"),
            ("EXTRA_TAGS", "a:b:c"),
        ] {
            let refused = check(&env(&[(name, value)])).unwrap_err();
            assert!(
                refused.starts_with(&format!("{name}={value:?}: ")),
                "{refused}"
            );
        }
        let both = check(&env(&[("REDIS_TLS", "yes"), ("SHADOW_MODE", "no")])).unwrap_err();
        assert_eq!(both.lines().count(), 2, "{both}");
    }

    #[test]
    fn the_table_names_each_variable_once() {
        let mut names: Vec<&str> = SETTINGS.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
    }
}
