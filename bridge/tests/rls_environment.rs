//! The binary started from envoyproxy/ratelimit's environment reads it as that service's Go
//! code does (issue 49, row 8): `GRPC_SERVER_USE_TLS=T` is Go's true, so the gRPC port
//! speaks TLS (the bridge read it as false and served a TLS deployment in plaintext), and
//! `yes`, which Go refuses, stops the bridge with the variable named (it started).

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::pki::{Ca, Scratch};
use test_support::{free_port, Valkey};

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");
/// A bound on waiting for the bridge to start or exit, never what a test's verdict rests
/// on: each waits for the bridge's own word (its log line, its exit).
const WAIT: Duration = Duration::from_secs(30);

/// A bridge started from an environment, killed when dropped.
struct Bridge {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bridge {
    /// The bridge with envoyproxy/ratelimit's variables `vars` and nothing else of the
    /// test's environment; its configuration directory under `dir`.
    fn start(dir: &Scratch, vars: &[(&str, String)]) -> Bridge {
        let config = dir.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("api.yaml"), "domain: api\n").unwrap();
        let log = dir.path().join("stderr.log");
        let child = Command::new(BINARY)
            .env_clear()
            .env("RUNTIME_ROOT", dir.path())
            .env("RUST_LOG", "info")
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Bridge { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How it ended, or `None` once it says it listens on `port` and takes connections.
    fn exit_or_listen(&mut self, port: u16) -> Option<ExitStatus> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if self.log().contains("listening on")
                && TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "the bridge neither exited nor listened; it said:\n{}",
            self.log()
        );
    }
}

/// The variables of a deployment serving gRPC on `grpc` and probes on `http`, loopback only.
fn deployment(valkey: &Valkey, grpc: u16, http: u16) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", valkey.addr().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", http.to_string()),
    ]
}

/// Whether a TLS handshake trusting `ca` completes with `port`.
fn tls_handshake(port: u16, ca: &Ca) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der()).map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut socket = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(WAIT))
        .map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What the port answers a plaintext HTTP/1.1 `GET /healthz` with (empty: nothing).
fn plaintext_answer(port: u16) -> String {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn go_true_t_serves_tls_on_the_grpc_port() {
    let valkey = Valkey::start();
    let ca = Ca::new("ratelimit-ca");
    let served = ca.server(&["localhost"]);
    let dir = Scratch::new();
    let (cert, key) = (
        dir.write("tls.crt", &served.cert_pem),
        dir.write("tls.key", &served.key_pem),
    );
    let (grpc, http) = (free_port(), free_port());
    let mut vars = deployment(&valkey, grpc, http);
    vars.extend([
        ("GRPC_SERVER_USE_TLS", "T".to_owned()),
        ("GRPC_SERVER_TLS_CERT", path(&cert)),
        ("GRPC_SERVER_TLS_KEY", path(&key)),
    ]);
    let mut bridge = Bridge::start(&dir, &vars);
    if let Some(status) = bridge.exit_or_listen(grpc) {
        panic!("the bridge exited ({status}); it said:\n{}", bridge.log());
    }
    let plain = plaintext_answer(grpc);
    assert!(
        !plain.starts_with("HTTP/1.1"),
        "GRPC_SERVER_USE_TLS=T served plaintext: {plain}"
    );
    tls_handshake(grpc, &ca).unwrap_or_else(|e| panic!("no TLS on the gRPC port: {e}"));
}

#[test]
fn a_boolean_go_refuses_stops_the_bridge_naming_it() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let (grpc, http) = (free_port(), free_port());
    for (name, value) in [("GRPC_SERVER_USE_TLS", "yes"), ("REDIS_TLS", "on")] {
        let mut vars = deployment(&valkey, grpc, http);
        vars.push((name, value.to_owned()));
        let mut bridge = Bridge::start(&dir, &vars);
        let status = bridge.exit_or_listen(grpc);
        let log = bridge.log();
        let Some(status) = status else {
            panic!("{name}={value} served instead of refusing to start; it said:\n{log}");
        };
        assert!(!status.success(), "{status}");
        assert!(log.contains(&format!("{name}=\"{value}\"")), "{log}");
    }
}
