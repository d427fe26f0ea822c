//! Valkey Clusters for the tests of the store in cluster mode: one node holding every slot
//! (cheap, for the store's own behaviour), and three primaries on loopback, optionally with
//! a password on every node (`requirepass`, `masterauth`) and a TLS proxy in front of each
//! node. With proxies, each node announces its proxy's port (`cluster-announce-port`), so
//! the topology a client discovers (`CLUSTER SLOTS`, `MOVED`) points at the proxies: every
//! connection is TLS.

use super::Connect;
use ratelimit_bridge::store::slot::slot;
use redis::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::pki::{Identity, Scratch};
use test_support::tls_proxy::TlsProxy;
use test_support::{free_port, Valkey};

/// A `valkey-server --cluster-enabled yes` that owns all 16384 slots, killed when dropped.
pub struct OneNodeCluster {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl OneNodeCluster {
    pub fn start() -> OneNodeCluster {
        let binary = std::env::var_os("RATELIMIT_VALKEY").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/valkey-server"),
            PathBuf::from,
        );
        let port = test_support::free_port();
        let dir = std::env::temp_dir().join(format!("ratelimit-cluster-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &test_support::free_port().to_string()])
            .args([
                "--dir",
                dir.to_str().unwrap(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (run `make setup`)", binary.display()));
        let node = OneNodeCluster { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut conn = loop {
            match redis::Client::open(node.url()).unwrap().get_connection() {
                Ok(conn) => break conn,
                Err(e) if Instant::now() > deadline => panic!("valkey did not start: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _: () = redis::cmd("CLUSTER")
            .arg(&["ADDSLOTSRANGE", "0", "16383"][..])
            .query(&mut conn)
            .unwrap();
        while Instant::now() < deadline {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
            if info.contains("cluster_state:ok") {
                return node;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the cluster never became ok");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap();
        cmd.query(&mut conn).unwrap()
    }
}

impl Drop for OneNodeCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Connect for OneNodeCluster {
    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

/// The slots of each primary.
pub const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Which of the three primaries serves `key` (as `Cluster::start` leaves them).
pub fn node_of(key: &str) -> usize {
    let s = slot(key.as_bytes());
    RANGES
        .iter()
        .position(|&(a, b)| (a..=b).contains(&s))
        .unwrap()
}

struct Node {
    valkey: Valkey,
    bus: u16,
}

pub struct Cluster {
    // Dropped before the nodes: client connections close before the servers go.
    pub proxies: Vec<TlsProxy>,
    nodes: Vec<Node>,
    password: Option<String>,
    _dir: Scratch,
}

impl Cluster {
    /// Starts the nodes, joins them and waits until every node sees all three primaries at
    /// their announced ports.
    pub fn start(password: Option<&str>, tls: Option<&Identity>) -> Cluster {
        let dir = Scratch::new();
        let nodes: Vec<Node> = RANGES
            .iter()
            .map(|_| {
                // An explicit bus port: the default (port + 10000) may be out of range.
                let bus = free_port();
                let (bus_arg, config) = (bus.to_string(), format!("nodes-{bus}.conf"));
                let mut args = vec!["--cluster-enabled", "yes", "--cluster-port", &bus_arg];
                args.extend(["--cluster-config-file", &config]);
                args.extend(["--cluster-node-timeout", "2000"]);
                args.extend(["--dir", dir.path().to_str().unwrap()]);
                if let Some(password) = password {
                    args.extend(["--requirepass", password, "--masterauth", password]);
                }
                Node {
                    valkey: Valkey::start_with(&args),
                    bus,
                }
            })
            .collect();
        let proxies = match tls {
            Some(identity) => nodes
                .iter()
                .map(|n| TlsProxy::start(n.valkey.addr(), identity, None))
                .collect(),
            None => Vec::new(),
        };
        let cluster = Cluster {
            proxies,
            nodes,
            password: password.map(String::from),
            _dir: dir,
        };
        for (i, (first, last)) in RANGES.iter().enumerate() {
            if let Some(proxy) = cluster.proxies.get(i) {
                let _: () = cluster.cmd(
                    i,
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("cluster-announce-port")
                        .arg(proxy.port),
                );
            }
            let _: () = cluster.cmd(
                i,
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            );
        }
        for node in &cluster.nodes[1..] {
            let _: () = cluster.cmd(
                0,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.valkey.port)
                    .arg(node.bus),
            );
        }
        cluster.wait_until_slots_agree();
        cluster
    }

    /// The port clients are sent to for node `i`: its proxy's, else its own.
    pub fn announced_port(&self, i: usize) -> u16 {
        self.proxies
            .get(i)
            .map_or(self.nodes[i].valkey.port, |p| p.port)
    }

    /// One seed URL (`rediss://` to the first proxy with TLS), without credentials.
    pub fn seed(&self) -> String {
        let scheme = if self.proxies.is_empty() {
            "redis"
        } else {
            "rediss"
        };
        format!("{scheme}://127.0.0.1:{}", self.announced_port(0))
    }

    /// Runs `cmd` on node `i` directly (plaintext, with the password).
    pub fn cmd<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |p| format!(":{p}@"));
        let url = format!("redis://{auth}127.0.0.1:{}", self.nodes[i].valkey.port);
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        cmd.query(&mut conn).unwrap()
    }

    /// Node `i`'s server (plaintext, no password: for a cluster started without one).
    pub fn node(&self, i: usize) -> &Valkey {
        &self.nodes[i].valkey
    }

    /// Starts moving `slot` from primary `from` to primary `to` as `valkey-cli --cluster
    /// reshard` does: `to` importing it, `from` migrating it.
    pub fn start_migration(&self, slot: u16, from: usize, to: usize) {
        let id = |i: usize| self.cmd::<String>(i, redis::cmd("CLUSTER").arg("MYID"));
        let setslot = |i: usize, state: &str, node: String| {
            let cmd = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node)
                .clone();
            self.cmd::<()>(i, &cmd);
        };
        setslot(to, "IMPORTING", id(from));
        setslot(from, "MIGRATING", id(to));
    }

    /// Moves `key` (of a slot migrating from `from` to `to`) over, as a resharding does.
    pub fn migrate_key(&self, key: &str, from: usize, to: usize) {
        let port = self.nodes[to].valkey.port;
        let migrate = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(key)
            .clone();
        let _: Value = self.cmd(from, &migrate);
    }

    /// Ends the move of `slot`: every primary names `to` as its owner.
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let id = self.cmd::<String>(to, redis::cmd("CLUSTER").arg("MYID"));
        for i in (0..self.nodes.len()).map(|n| (n + to) % self.nodes.len()) {
            let cmd = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&id)
                .clone();
            self.cmd::<()>(i, &cmd);
        }
    }

    fn wait_until_slots_agree(&self) {
        let expected: Vec<(i64, i64, i64)> = RANGES
            .iter()
            .enumerate()
            .map(|(i, (first, last))| {
                (
                    i64::from(*first),
                    i64::from(*last),
                    i64::from(self.announced_port(i)),
                )
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            let agreed = (0..self.nodes.len()).all(|i| {
                let info: String = self.cmd(i, redis::cmd("CLUSTER").arg("INFO"));
                last = slots(&self.cmd(i, redis::cmd("CLUSTER").arg("SLOTS")));
                info.contains("cluster_state:ok") && last == expected
            });
            if agreed {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the cluster's slot map did not agree: last CLUSTER SLOTS {last:?}, expected {expected:?}");
    }
}

/// `CLUSTER SLOTS` as (first slot, last slot, primary's port), by first slot; a primary
/// whose address is still unknown (no IP yet) is left out.
fn slots(reply: &Value) -> Vec<(i64, i64, i64)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let mut out: Vec<(i64, i64, i64)> = ranges
        .iter()
        .filter_map(|range| match range {
            Value::Array(fields) => match fields.as_slice() {
                [Value::Int(first), Value::Int(last), Value::Array(primary), ..] => {
                    match primary.as_slice() {
                        [Value::BulkString(ip), Value::Int(port), ..] if !ip.is_empty() => {
                            Some((*first, *last, *port))
                        }
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    out.sort_unstable();
    out
}
