//! Real servers for the Rust tests: a Valkey (or Redis) server and the built
//! `ratelimit-bridge`, each on a free loopback port, stopped when dropped; and a TLS proxy
//! with test-time certificates to put in front of Valkey. Test-only code: it fails loudly,
//! with how to fix the environment.
//!
//! # Layout
//!
//! - `pki`: certificates made at test time (a CA, server and client certificates).
//! - `tls_proxy`: a TLS-terminating proxy in front of a plaintext server, using `pki`.
//! - this file: the servers themselves, `Valkey` and `Bridge`, on free loopback ports.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

pub mod pki;
pub mod tls_proxy;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A program given by `$var` (the Makefile sets it), else `default` under the repository,
/// else `names` on the PATH.
fn program(var: &str, default: &str, names: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return path.into();
    }
    let local = repo_root().join(default);
    if local.exists() {
        return local;
    }
    for name in names {
        let found = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| p.exists());
        if let Some(found) = found {
            return found;
        }
    }
    panic!("no {default}: run `make setup build` (or set {var})");
}

/// Where test ports come from: below Linux's ephemeral range (32768 and up), so no
/// outgoing connection of this or another test can take a port between the moment it is
/// picked and the moment its server binds it (which failed CI once with EADDRINUSE).
const TEST_PORTS: std::ops::Range<u16> = 20000..32000;

/// A free TCP port on 127.0.0.1 (bound then released), never the same twice in one
/// process; processes start at different points of the range.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let port = TEST_PORTS.start + u16::try_from(offset).expect("offset below the span");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?} on 127.0.0.1");
}

/// A child process killed when dropped.
/// A server that is killed when dropped, and the directory of its own it ran in, removed.
struct Guard(Child, Option<PathBuf>);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(dir) = &self.1 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new, empty directory for one server: what a server writes (a replica's copy of its
/// primary's snapshot) stays there, and no later server finds it and starts from it.
fn own_dir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for a test server");
    dir
}

fn wait_until(child: &mut Child, ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false; // e.g. the port was taken after all
        }
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Sends `request` and reads the answer until the peer closes or `done` says enough.
fn exchange(addr: SocketAddr, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.write_all(request).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !done(&reply) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    Some(reply)
}

/// A Valkey server that lives as long as this value.
pub struct Valkey {
    child: Option<Guard>,
    pub port: u16,
    /// Extra command line arguments, kept for a restart.
    args: Vec<String>,
}

impl Valkey {
    pub fn start() -> Valkey {
        Valkey::start_with(&[])
    }

    /// With extra command line arguments, e.g. `["--requirepass", "pw"]`.
    pub fn start_with(args: &[&str]) -> Valkey {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = Valkey::spawn(port, &args) {
                return Valkey {
                    child: Some(child),
                    port,
                    args,
                };
            }
        }
        panic!("valkey-server did not start");
    }

    /// Kills the server (as a crash would: no shutdown, nothing saved).
    pub fn stop(&mut self) {
        self.child = None;
    }

    /// A new, empty server on the same port with the same arguments, as after a restart.
    pub fn restart(&mut self) {
        self.stop();
        let child = Valkey::spawn(self.port, &self.args);
        self.child = Some(child.expect("valkey-server restarts on its port"));
    }

    /// A server on `port`, once it answers `PING` (or asks for a password: up, too);
    /// `None` if it exits first.
    fn spawn(port: u16, args: &[String]) -> Option<Guard> {
        let binary = program(
            "RATELIMIT_VALKEY",
            ".venv/bin/valkey-server",
            &["valkey-server", "redis-server"],
        );
        // Its own directory, unless the caller names one (the last `--dir` is the one read).
        let dir = own_dir("ratelimit-valkey");
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start valkey-server");
        let mut guard = Guard(child, Some(dir));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let pong = || {
            exchange(addr, b"PING\r\n", |r| r.ends_with(b"\r\n"))
                .is_some_and(|r| r.starts_with(b"+PONG") || r.starts_with(b"-NOAUTH"))
        };
        wait_until(&mut guard.0, pong).then_some(guard)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// The built `dist/ratelimit-bridge`, serving one Redis URL.
pub struct Bridge {
    _child: Guard,
    pub addr: SocketAddr,
}

impl Bridge {
    pub fn start(redis_url: &str) -> Bridge {
        let binary = program(
            "RATELIMIT_BRIDGE",
            "dist/ratelimit-bridge",
            &["ratelimit-bridge"],
        );
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let child = Command::new(&binary)
                .args(["--listen", &addr.to_string(), "--redis", redis_url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start ratelimit-bridge");
            let mut guard = Guard(child, None);
            let healthy = || {
                exchange(
                    addr,
                    b"GET /healthz HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n",
                    |_| false,
                )
                .is_some_and(|r| r.starts_with(b"HTTP/1.1 200"))
            };
            if wait_until(&mut guard.0, healthy) {
                return Bridge {
                    _child: guard,
                    addr,
                };
            }
        }
        panic!("ratelimit-bridge did not start");
    }
}

/// A scripted HTTP/1.1 server on a free loopback port: answers one connection per entry of
/// `replies` (raw bytes, status line included) after reading its request, and returns the
/// requests it read, so a test checks exactly what went on the wire.
pub fn scripted_http(replies: Vec<Vec<u8>>) -> (SocketAddr, std::thread::JoinHandle<Vec<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    let handle = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for reply in replies {
            let (mut conn, _) = listener.accept().expect("a connection");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") || !request.ends_with(b"\n") {
                let n = conn.read(&mut buf).expect("read the request");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(&reply).expect("write the reply");
            requests.push(request);
        }
        requests
    });
    (addr, handle)
}
