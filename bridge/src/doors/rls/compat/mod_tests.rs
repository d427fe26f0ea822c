//! The translation of envoyproxy/ratelimit's environment, deployment by deployment.

use super::*;
use std::collections::HashMap;

fn from(vars: &[(&str, &str)]) -> Result<HashMap<&'static str, String>, String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    translate(|name| vars.get(name).cloned()).map(|v| v.into_iter().collect())
}

#[test]
fn istios_sample_deployment_is_read() {
    let got = from(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6379"),
        ("USE_STATSD", "false"),
    ])
    .unwrap();
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_CONFIG"], "/data/ratelimit/config");
    assert_eq!(got["RATELIMIT_BRIDGE_REDIS"], "redis://redis:6379");
    assert_eq!(got["RATELIMIT_BRIDGE_LISTEN"], "0.0.0.0:8081");
    assert!(!got.contains_key("RATELIMIT_BRIDGE_CLUSTER"));
    assert_eq!(got["RATELIMIT_BRIDGE_PROBE_LISTEN"], "0.0.0.0:8080");
    assert!(!got.contains_key("RATELIMIT_BRIDGE_TLS_CERT"));
}

/// What Envoy Gateway's rate limit Deployment sets (internal/infrastructure/kubernetes/
/// ratelimit/resource.go), with Prometheus on and Redis over TLS.
#[test]
fn envoy_gateways_deployment_is_read() {
    let got = from(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
    ])
    .unwrap();
    assert!(!got.contains_key("RATELIMIT_BRIDGE_RLS_CONFIG"));
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_XDS"], "envoy-gateway:18001");
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_XDS_NODE"], "envoy-ratelimit");
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_XDS_TLS"], "true");
    assert_eq!(
        got["RATELIMIT_BRIDGE_RLS_XDS_CLIENT_CERT"],
        "/certs/tls.crt"
    );
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_XDS_CLIENT_KEY"], "/certs/tls.key");
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_XDS_CA"], "/certs/ca.crt");
    assert_eq!(got["RATELIMIT_BRIDGE_TLS_CERT"], "/certs/tls.crt");
    assert_eq!(got["RATELIMIT_BRIDGE_TLS_KEY"], "/certs/tls.key");
    assert!(!got.contains_key("RATELIMIT_BRIDGE_TLS_CLIENT_CA"));
    assert_eq!(got["RATELIMIT_BRIDGE_LISTEN"], "0.0.0.0:8081");
    assert_eq!(
        got["RATELIMIT_BRIDGE_PROBE_LISTEN"],
        "0.0.0.0:8080,0.0.0.0:19001"
    );
    assert_eq!(
        got["RATELIMIT_BRIDGE_REDIS"],
        "rediss://redis.redis-system.svc.cluster.local:6379"
    );
    assert_eq!(
        got["RATELIMIT_BRIDGE_REDIS_CLIENT_CERT"],
        "/redis-certs/tls.crt"
    );
    assert_eq!(
        got["RATELIMIT_BRIDGE_REDIS_CLIENT_KEY"],
        "/redis-certs/tls.key"
    );
}

#[test]
fn clusters_sentinels_tls_and_credentials() {
    let got = from(&[
        ("RUNTIME_ROOT", "/srv/runtime/"),
        ("RUNTIME_APPDIRECTORY", "limits"),
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "a:7000, b:7001"),
        ("REDIS_TLS", "true"),
        ("REDIS_AUTH", "bridge:p@ss:w/rd"),
        ("GRPC_PORT", "9000"),
    ])
    .unwrap();
    assert_eq!(got["RATELIMIT_BRIDGE_RLS_CONFIG"], "/srv/runtime/limits");
    assert_eq!(got["RATELIMIT_BRIDGE_CLUSTER"], "true");
    assert_eq!(
        got["RATELIMIT_BRIDGE_REDIS"],
        "rediss://bridge:p%40ss%3Aw%2Frd@a:7000,rediss://bridge:p%40ss%3Aw%2Frd@b:7001"
    );
    assert_eq!(got["RATELIMIT_BRIDGE_LISTEN"], "0.0.0.0:9000");
    let got = from(&[
        ("RUNTIME_ROOT", "/data"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ("REDIS_AUTH", "secret"),
    ])
    .unwrap();
    assert_eq!(got["RATELIMIT_BRIDGE_SENTINEL"], "mymaster");
    assert_eq!(
        got["RATELIMIT_BRIDGE_REDIS"],
        "redis://:secret@s1:26379,redis://:secret@s2:26379"
    );
}

/// Go's `T` is true: their TLS deployment is TLS here, their Redis over TLS too, and
/// a spelling Go refuses stops the bridge, naming the variable and its value.
#[test]
fn booleans_and_ports_are_read_as_go_reads_them() {
    let got = from(&[
        ("RUNTIME_ROOT", "/data"),
        ("GRPC_SERVER_USE_TLS", "T"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("REDIS_URL", "redis:6379"),
        ("REDIS_TLS", "t"),
        ("USE_PROMETHEUS", "1"),
        ("GRPC_PORT", "0x1F91"),
        ("PORT", "+8080"),
    ])
    .unwrap();
    assert_eq!(got["RATELIMIT_BRIDGE_TLS_CERT"], "/certs/tls.crt");
    assert_eq!(got["RATELIMIT_BRIDGE_REDIS"], "rediss://redis:6379");
    assert_eq!(got["RATELIMIT_BRIDGE_LISTEN"], "0.0.0.0:8081");
    assert_eq!(
        got["RATELIMIT_BRIDGE_PROBE_LISTEN"],
        "0.0.0.0:8080,0.0.0.0:9090"
    );
    for (name, value) in [
        ("GRPC_SERVER_USE_TLS", "yes"),
        ("REDIS_TLS", "on"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "Yes"),
        ("USE_STATSD", ""),
        ("GRPC_PORT", "8081/tcp"),
    ] {
        let error = from(&[("RUNTIME_ROOT", "/data"), (name, value)]).unwrap_err();
        assert!(error.contains(&format!("{name}={value:?}")), "{error}");
    }
    let error = from(&[("RUNTIME_ROOT", "/data"), ("CONFIG_TYPE", "file")]).unwrap_err();
    assert!(error.contains("CONFIG_TYPE=file"), "{error}");
}

#[test]
fn nothing_without_runtime_root_and_clear_refusals() {
    assert!(from(&[("REDIS_URL", "redis:6379")]).unwrap().is_empty());
    // Their defaults, written out, are read.
    for (name, value) in [
        ("BACKEND_TYPE", "redis"),
        ("BACKEND_TYPE", ""),
        ("QUOTA_MODE", "false"),
    ] {
        assert!(
            from(&[("RUNTIME_ROOT", "/data"), (name, value)]).is_ok(),
            "{name}={value}"
        );
    }
    for (vars, said) in [
        (vec![("REDIS_SOCKET_TYPE", "unix")], "only tcp"),
        (vec![("REDIS_URL", "a:1,b:2")], "one host:port"),
        (
            vec![("REDIS_URL", "a:1"), ("REDIS_TYPE", "sentinel")],
            "master,host:port",
        ),
        (
            vec![("REDIS_URL", "a:1"), ("REDIS_TYPE", "ring")],
            "REDIS_TYPE=ring",
        ),
        (
            vec![("CONFIG_TYPE", "GRPC_XDS_DELTA")],
            "CONFIG_TYPE=GRPC_XDS_DELTA",
        ),
        (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache"),
        (vec![("BACKEND_TYPE", "Redis")], "BACKEND_TYPE=Redis"),
        (vec![("QUOTA_MODE", "T")], "QUOTA_MODE"),
    ] {
        let mut vars = vars;
        vars.push(("RUNTIME_ROOT", "/data"));
        let error = from(&vars).unwrap_err();
        assert!(error.contains(said), "{error}");
    }
}
