//! A hostile `--rls-config` reload never stalls the bridge (issue 49, row 4): a 160 kB file
//! of nested brackets, whose parse took 21 s on the runtime with `--threads 1` (every
//! `/healthz` and `ShouldRateLimit` waited), is refused by its bounds before the parser
//! sees it, on a thread of its own, while `/healthz` keeps being answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::pki::Scratch;
use test_support::{free_port, Valkey};

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");
/// A probe unanswered this long was held: the bridge answers in milliseconds, and the
/// parse held it for tens of seconds.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A bound on waiting for the bridge's own word (that it listens, that it reloaded).
const WAIT: Duration = Duration::from_secs(120);

struct Bridge(Child);

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long `GET /healthz` took to be answered 200, or why it was not.
fn healthz(addr: SocketAddr) -> Result<Duration, String> {
    let start = Instant::now();
    let mut socket = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let read = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    match read {
        Ok(_) if answer.starts_with("HTTP/1.1 200") => Ok(start.elapsed()),
        Ok(_) => Err(format!("answered {answer:?}")),
        Err(e) => Err(format!("no answer within {PROBE_TIMEOUT:?} ({e})")),
    }
}

#[test]
fn a_hostile_reload_leaves_the_bridge_answering() {
    let valkey = Valkey::start();
    let dir = Scratch::new();
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _bridge = Bridge(
        Command::new(BINARY)
            .args(["--threads", "1", "--listen", &addr.to_string()])
            .args(["--redis", &valkey.url()])
            .arg("--rls-config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    while !(said().contains("listening on") && TcpStream::connect(addr).is_ok()) {
        assert!(
            Instant::now() < deadline,
            "the bridge did not start:\n{}",
            said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    healthz(addr).unwrap();

    // Probes from now until the reload is over, one after another.
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut probes = Vec::new();
            while !done.load(Ordering::Relaxed) {
                probes.push(healthz(addr));
                std::thread::sleep(Duration::from_millis(10));
            }
            probes
        })
    };
    let depth = 80_000;
    let hostile = format!(
        "domain: evil\ndescriptors: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    assert!(hostile.len() > 160_000);
    std::fs::write(config.join("evil.yaml"), hostile).unwrap();
    // The watcher looks every second; its verdict is logged once the file was read.
    while !said().contains("kept the configuration in force") {
        assert!(
            Instant::now() < deadline,
            "the reload was never judged:\n{}",
            said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    let held: Vec<&String> = probes.iter().filter_map(|p| p.as_ref().err()).collect();
    assert!(
        held.is_empty(),
        "{} of {} probes were not answered during the reload: {:?}",
        held.len(),
        probes.len(),
        held.first()
    );
    assert!(!probes.is_empty());
    let verdict = said();
    assert!(
        verdict.contains("evil.yaml: line 2: flow collections"),
        "refused by its bounds, naming the file and line:\n{verdict}"
    );
    // The configuration in force still serves.
    healthz(addr).unwrap();
}
