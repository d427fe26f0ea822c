//! Test support: a real Valkey (or Redis) server per test on a free loopback port, and
//! the native model of the token bucket the Lua script is held to.

#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support fails loudly

pub mod model;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary: `$RATELIMIT_VALKEY` (set by the Makefile), else the repository's
/// `.venv`, else `valkey-server` / `redis-server` on the PATH.
fn server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RATELIMIT_VALKEY") {
        return path.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/valkey-server");
    if venv.exists() {
        return venv;
    }
    for name in ["valkey-server", "redis-server"] {
        if let Some(found) = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| p.exists())
        {
            return found;
        }
    }
    panic!("no valkey-server: run `make setup` (or set RATELIMIT_VALKEY)");
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Valkey server that lives as long as this value.
pub struct Valkey {
    child: Child,
    pub port: u16,
}

impl Valkey {
    pub fn start() -> Valkey {
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new(server_binary())
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start valkey-server");
            let mut server = Valkey { child, port };
            if server.wait_ready() {
                return server;
            }
            let _ = server.child.kill();
        }
        panic!("valkey-server did not start");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // the port was taken after all
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for Valkey {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
