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
//! | `SHADOW_MODE`, `MERGE_DOMAIN_CONFIG`, `RESPONSE_DYNAMIC_METADATA` | `--rls-shadow-mode`, `--rls-merge-domains`, `--rls-dynamic-metadata` |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED` (`false`: no headers, the bridge's `draft03` default is not used), `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` | `--rls-response-headers off` or `reference`, `--rls-limit-header`, `--rls-remaining-header`, `--rls-reset-header` |
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
    // Settings whose meaning the bridge cannot give are refused, not ignored: memcache
    // buckets (theirs refuses any other backend too), and quota mode everywhere (as
    // `quota_mode` in the configuration is), which changes which calls are over.
    if let Some(backend) = get("BACKEND_TYPE").filter(|b| !b.is_empty() && b != "redis") {
        return Err(format!(
            "BACKEND_TYPE={backend}: the bridge keeps its buckets in Redis (redis) only"
        ));
    }
    if truthy("QUOTA_MODE") {
        return Err("QUOTA_MODE: quota mode is not supported".into());
    }
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
    for (theirs, ours) in [
        ("SHADOW_MODE", "RATELIMIT_BRIDGE_RLS_SHADOW_MODE"),
        ("MERGE_DOMAIN_CONFIG", "RATELIMIT_BRIDGE_RLS_MERGE_DOMAINS"),
        (
            "RESPONSE_DYNAMIC_METADATA",
            "RATELIMIT_BRIDGE_RLS_DYNAMIC_METADATA",
        ),
    ] {
        if truthy(theirs) {
            out.push((ours, "true".into()));
        }
    }
    // Their answers carry no headers unless asked: with the bridge's draft03 default, an
    // Envoy making its own (`enable_x_ratelimit_headers`) sent every header twice.
    if truthy("LIMIT_RESPONSE_HEADERS_ENABLED") {
        out.push(("RATELIMIT_BRIDGE_RLS_RESPONSE_HEADERS", "reference".into()));
        out.extend(copied(&[
            ("LIMIT_LIMIT_HEADER", "RATELIMIT_BRIDGE_RLS_LIMIT_HEADER"),
            (
                "LIMIT_REMAINING_HEADER",
                "RATELIMIT_BRIDGE_RLS_REMAINING_HEADER",
            ),
            ("LIMIT_RESET_HEADER", "RATELIMIT_BRIDGE_RLS_RESET_HEADER"),
        ]));
    } else {
        out.push(("RATELIMIT_BRIDGE_RLS_RESPONSE_HEADERS", "off".into()));
    }
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
#[path = "mod_tests.rs"]
mod tests;
