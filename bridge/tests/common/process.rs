//! The `ratelimit-bridge` binary as an operator runs it: flags in, its log captured, checks
//! over plain HTTP/1.1. Holds `main.rs` to its word (flags, startup errors, the log line).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use test_support::free_port;
use test_support::pki::Scratch;

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");

/// A running bridge, killed when dropped.
pub struct BridgeProcess {
    child: Child,
    pub addr: SocketAddr,
    log: std::path::PathBuf,
    _dir: Scratch,
}

impl BridgeProcess {
    /// Starts the binary with `args` and `--listen` on a free port; waits until it serves
    /// HTTP (healthy or not).
    pub fn start(args: &[&str]) -> BridgeProcess {
        for _ in 0..5 {
            let dir = Scratch::new();
            let log = dir.path().join("stderr.log");
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let child = Command::new(BINARY)
                .args(["--listen", &addr.to_string()])
                .args(args)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut bridge = BridgeProcess {
                child,
                addr,
                log,
                _dir: dir,
            };
            // Its own log line, not only a connection: another process may hold the port
            // (then this bridge exits with EADDRINUSE, and the next try takes another).
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline && bridge.running() {
                if bridge.log().contains("listening on") && TcpStream::connect(addr).is_ok() {
                    return bridge;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("ratelimit-bridge did not start");
    }

    /// Runs the binary with `args` until it exits (it should: the flags are wrong); its
    /// exit status and what it wrote to stderr.
    pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
        let output = Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into(),
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the bridge logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// `POST /v1/check` with `body`: the status code and the answer.
    pub fn check(&self, body: &str) -> (u16, String) {
        self.http("POST", "/v1/check", body, None)
    }

    /// `method path` (HTTP/1.1) with `body`, as a caller holding `token` (`authorization:
    /// Bearer <token>`; `None`: no header): the status code and the answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &str,
        token: Option<&str>,
    ) -> (u16, String) {
        self.http(method, path, body, token)
    }

    /// `GET /healthz`'s status code.
    pub fn health(&self) -> u16 {
        self.http("GET", "/healthz", "", None).0
    }

    fn http(&self, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
        match TcpStream::connect(self.addr) {
            Ok(conn) => http(conn, method, path, body, token),
            // Says why: a bridge that died, or a port taken from under it.
            Err(e) => panic!(
                "{method} {path}: connecting to {}: {e}; the bridge's log:\n{}",
                self.addr,
                self.log()
            ),
        }
    }
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(
    mut conn: TcpStream,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let authorization = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: bridge\r\nconnection: close\r\n\
         {authorization}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {reply:?}"));
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}
