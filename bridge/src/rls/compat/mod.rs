//! envoyproxy/ratelimit's environment, read as the bridge's own: a Deployment made for that
//! service (Istio's sample, a Helm chart) runs the bridge by swapping the image and
//! keeping its variables. It applies only where `RUNTIME_ROOT` is set, the variable every
//! such deployment has (where its YAML lives), and only to settings that neither a flag
//! nor the bridge's own `RATELIMIT_BRIDGE_*` variable gives.
//!
//! | theirs | the bridge's |
//! |---|---|
//! | `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY` (`config`) | `--rls-config` |
//! | `REDIS_URL` (`host:port`, comma-separated), `REDIS_TYPE` (`single`, `cluster`, `sentinel`: `master,host:port,...`), `REDIS_TLS`, `REDIS_AUTH` (`password` or `user:password`) | `--redis`, `--cluster`, `--sentinel` |
//! | `GRPC_HOST` (`0.0.0.0`), `GRPC_PORT` (`8081`) | `--listen` |
//! | `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`/`_KEY`, `GRPC_CLIENT_TLS_CACERT` | `--tls-cert`, `--tls-key`, `--tls-client-ca` |
//! | `HOST`/`PORT` (`0.0.0.0:8080`, `/healthcheck`), `USE_PROMETHEUS` with `PROMETHEUS_ADDR` (`:9090`) | `--probe-listen` |
//! | `CONFIG_TYPE=GRPC_XDS_SOTW`, `CONFIG_GRPC_XDS_SERVER_URL`, `CONFIG_GRPC_XDS_NODE_ID`, `CONFIG_GRPC_XDS_SERVER_USE_TLS`, `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`/`_KEY`, `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`, `CONFIG_GRPC_XDS_SERVER_TLS_SAN` | `--rls-xds`, `--rls-xds-node`, `--rls-xds-tls`, `--rls-xds-client-cert`/`-key`, `--rls-xds-ca`, `--rls-xds-server-name` |
//! | `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`/`_KEY` | `--redis-ca-file`, `--redis-client-cert`/`-key` |
//!
//! Every variable is read as that service's Go code reads it (`settings`: booleans by
//! `strconv.ParseBool`, integers by `strconv.ParseInt`, durations by `time.ParseDuration`,
//! each in `go`), and the bridge refuses to start, naming the variable, on any value that
//! service refuses: `GRPC_SERVER_USE_TLS=T` is TLS there, so it must never be plaintext here.

mod go;
mod settings;

/// The bridge's variables `get` (theirs) stands for, or why it cannot; empty without
/// `RUNTIME_ROOT`.
pub fn translate(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, String)>, String> {
    let Some(root) = get("RUNTIME_ROOT") else {
        return Ok(Vec::new());
    };
    // Their variables that name a file the bridge's name too, copied where set.
    let copied = |pairs: &[(&str, &'static str)]| -> Vec<(&'static str, String)> {
        let set = |(theirs, ours): &(&str, &'static str)| {
            get(theirs).filter(|v| !v.is_empty()).map(|v| (*ours, v))
        };
        pairs.iter().filter_map(set).collect()
    };
    settings::check(&get)?;
    let truthy = |name: &str| settings::boolean(&get, name, false);
    let mut out = Vec::new();
    let kind = get("CONFIG_TYPE").unwrap_or_else(|| "FILE".into());
    // Compared as theirs compares it (a Go switch): `file` is no configuration type there.
    if kind == "GRPC_XDS_SOTW" {
        let server = get("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into());
        out.push(("RATELIMIT_BRIDGE_RLS_XDS", server));
        let node = get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or_else(|| "default".into());
        out.push(("RATELIMIT_BRIDGE_RLS_XDS_NODE", node));
        if truthy("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
            out.push(("RATELIMIT_BRIDGE_RLS_XDS_TLS", "true".into()));
            out.extend(copied(&[
                (
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                    "RATELIMIT_BRIDGE_RLS_XDS_CLIENT_CERT",
                ),
                (
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                    "RATELIMIT_BRIDGE_RLS_XDS_CLIENT_KEY",
                ),
                (
                    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                    "RATELIMIT_BRIDGE_RLS_XDS_CA",
                ),
                (
                    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
                    "RATELIMIT_BRIDGE_RLS_XDS_SERVER_NAME",
                ),
            ]));
        }
    } else if kind == "FILE" {
        let mut path = root;
        for (name, default) in [
            ("RUNTIME_SUBDIRECTORY", ""),
            ("RUNTIME_APPDIRECTORY", "config"),
        ] {
            let part = get(name).unwrap_or_else(|| default.to_owned());
            if !part.is_empty() {
                path = format!("{}/{}", path.trim_end_matches('/'), part.trim_matches('/'));
            }
        }
        out.push(("RATELIMIT_BRIDGE_RLS_CONFIG", path));
    } else {
        return Err(format!(
            "CONFIG_TYPE={kind}: the bridge reads its configuration from files (FILE) or an \
             xDS server (GRPC_XDS_SOTW)"
        ));
    }
    // As theirs does, GRPC_SERVER_USE_TLS asks for client certificates only with
    // GRPC_CLIENT_TLS_CACERT (Envoy Gateway sets GRPC_SERVER_TLS_CA_CERT, which it ignores).
    if truthy("GRPC_SERVER_USE_TLS") {
        out.extend(copied(&[
            ("GRPC_SERVER_TLS_CERT", "RATELIMIT_BRIDGE_TLS_CERT"),
            ("GRPC_SERVER_TLS_KEY", "RATELIMIT_BRIDGE_TLS_KEY"),
            ("GRPC_CLIENT_TLS_CACERT", "RATELIMIT_BRIDGE_TLS_CLIENT_CA"),
        ]));
    }
    let host = get("GRPC_HOST").unwrap_or_else(|| "0.0.0.0".into());
    let port = settings::integer(&get, "GRPC_PORT", 8081);
    out.push(("RATELIMIT_BRIDGE_LISTEN", format!("{host}:{port}")));
    // Their HTTP port answers /healthcheck, which their deployments probe; their Prometheus
    // port, /metrics.
    let host = get("HOST").unwrap_or_else(|| "0.0.0.0".into());
    let mut probes = vec![format!("{host}:{}", settings::integer(&get, "PORT", 8080))];
    if truthy("USE_PROMETHEUS") {
        let addr = get("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        probes.push(match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr,
        });
    }
    out.push(("RATELIMIT_BRIDGE_PROBE_LISTEN", probes.join(",")));
    out.extend(copied(&[
        ("REDIS_TLS_CACERT", "RATELIMIT_BRIDGE_REDIS_CA_FILE"),
        (
            "REDIS_TLS_CLIENT_CERT",
            "RATELIMIT_BRIDGE_REDIS_CLIENT_CERT",
        ),
        ("REDIS_TLS_CLIENT_KEY", "RATELIMIT_BRIDGE_REDIS_CLIENT_KEY"),
    ]));
    if let Some(socket) = get("REDIS_SOCKET_TYPE").filter(|s| !s.eq_ignore_ascii_case("tcp")) {
        return Err(format!("REDIS_SOCKET_TYPE={socket}: only tcp is supported"));
    }
    let Some(urls) = get("REDIS_URL") else {
        return Ok(out);
    };
    let scheme = if truthy("REDIS_TLS") {
        "rediss"
    } else {
        "redis"
    };
    let login = get("REDIS_AUTH").map(|auth| match auth.split_once(':') {
        Some((user, password)) => format!("{}:{}@", escape(user), escape(password)),
        None => format!(":{}@", escape(&auth)),
    });
    let mut hosts: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    let kind = get("REDIS_TYPE")
        .unwrap_or_else(|| "single".into())
        .to_ascii_lowercase();
    match kind.as_str() {
        "single" if hosts.len() == 1 => {}
        "single" => {
            return Err(format!(
                "REDIS_URL={urls}: one host:port for REDIS_TYPE single"
            ))
        }
        "cluster" => out.push(("RATELIMIT_BRIDGE_CLUSTER", "true".into())),
        "sentinel" if hosts.len() >= 2 => {
            let master = hosts.remove(0);
            out.push(("RATELIMIT_BRIDGE_SENTINEL", master.to_owned()));
        }
        "sentinel" => {
            return Err(format!(
                "REDIS_URL={urls}: REDIS_TYPE sentinel wants master,host:port[,host:port...]"
            ))
        }
        other => {
            return Err(format!(
                "REDIS_TYPE={other}: not single, cluster or sentinel"
            ))
        }
    }
    let login = login.unwrap_or_default();
    let urls: Vec<String> = hosts
        .iter()
        .map(|h| format!("{scheme}://{login}{h}"))
        .collect();
    out.push(("RATELIMIT_BRIDGE_REDIS", urls.join(",")));
    Ok(out)
}

/// Sets the bridge's variables that the process's environment (envoyproxy/ratelimit's)
/// stands for and that are not set already; returns their names. Called first thing in
/// `main`, before any thread exists.
pub fn apply() -> Result<Vec<&'static str>, String> {
    let mut set = Vec::new();
    for (name, value) in translate(|name| std::env::var(name).ok())? {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
            set.push(name);
        }
    }
    Ok(set)
}

/// Percent-encodes all but URL userinfo's unreserved characters.
fn escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
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
        ] {
            let mut vars = vars;
            vars.push(("RUNTIME_ROOT", "/data"));
            let error = from(&vars).unwrap_err();
            assert!(error.contains(said), "{error}");
        }
    }
}
