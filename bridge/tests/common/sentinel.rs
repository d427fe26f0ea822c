//! A replicated Valkey watched by Redis Sentinels, on loopback: a primary, its replicas and
//! three sentinels (quorum 2, a master down after 1 s), each on a free port. Each sentinel
//! rewrites its configuration file (it records what it learns), so each gets its own in a
//! scratch directory. Optionally the data nodes want a password (`requirepass`, with
//! `masterauth` for replication and `sentinel auth-pass` for the sentinels) and the
//! sentinels one of their own (`requirepass`, `sentinel sentinel-pass` between them).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::pki::Scratch;
use test_support::{free_port, Valkey};

pub const MASTER: &str = "mymaster";

/// A sentinel process, killed when dropped.
struct SentinelProcess {
    child: Child,
    port: u16,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Group {
    // Dropped first: no sentinel fails over while the data nodes go.
    sentinels: Vec<SentinelProcess>,
    pub primary: Valkey,
    pub replicas: Vec<Valkey>,
    password: Option<String>,
    sentinel_password: Option<String>,
    _dir: Scratch,
}

fn binary() -> PathBuf {
    std::env::var_os("RATELIMIT_VALKEY").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/valkey-server"),
        PathBuf::from,
    )
}

impl Group {
    /// Starts the group and waits until every sentinel knows the master, its replicas and
    /// the other sentinels (so that a failover can start at once).
    pub fn start(
        replicas: usize,
        password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> Group {
        let dir = Scratch::new();
        let mut auth = Vec::new();
        if let Some(password) = password {
            auth.extend(["--requirepass", password, "--masterauth", password]);
        }
        // Each node in a directory of its own: a replica stores the copy it syncs
        // (dump.rdb), which a server started later in the same directory would load.
        let node_dir = |name: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            path.to_str().unwrap().to_string()
        };
        let primary_dir = node_dir("primary");
        let mut args = auth.clone();
        args.extend(["--dir", &primary_dir]);
        let primary = Valkey::start_with(&args);
        let port = primary.port.to_string();
        let replicas = (0..replicas)
            .map(|i| {
                let replica_dir = node_dir(&format!("replica-{i}"));
                let mut args = auth.clone();
                args.extend(["--dir", &replica_dir, "--replicaof", "127.0.0.1", &port]);
                Valkey::start_with(&args)
            })
            .collect();
        let mut group = Group {
            sentinels: Vec::new(),
            primary,
            replicas,
            password: password.map(String::from),
            sentinel_password: sentinel_password.map(String::from),
            _dir: dir,
        };
        for i in 0..3 {
            let port = free_port();
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n",
                dir = group._dir.path().display(),
                master = group.primary.port,
            );
            if let Some(password) = password {
                conf.push_str(&format!("sentinel auth-pass {MASTER} {password}\n"));
            }
            if let Some(password) = sentinel_password {
                conf.push_str(&format!(
                    "requirepass {password}\nsentinel sentinel-pass {password}\n"
                ));
            }
            let path = group._dir.write(&format!("sentinel-{i}.conf"), conf);
            let log =
                std::fs::File::create(group._dir.path().join(format!("sentinel-{i}.log"))).unwrap();
            let child = Command::new(binary())
                .arg(&path)
                .arg("--sentinel")
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            group.sentinels.push(SentinelProcess { child, port });
        }
        let want = group.replicas.len();
        group.wait(
            "every sentinel to know the group",
            Duration::from_secs(30),
            |g| {
                (0..3).all(|i| {
                    g.sentinel_field(i, "num-other-sentinels") == Some("2".into())
                        && g.sentinel_field(i, "num-slaves") == Some(want.to_string())
                        && g.sentinel_field(i, "flags") == Some("master".into())
                })
            },
        );
        group
    }

    /// `--redis` for the bridge: every sentinel.
    pub fn urls(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn sentinel(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        let auth = self
            .sentinel_password
            .as_ref()
            .map_or(String::new(), |p| format!(":{p}@"));
        let port = self.sentinels[i].port;
        redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))?
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    /// Runs `cmd` on every sentinel.
    pub fn on_sentinels(&self, cmd: &redis::Cmd) {
        for i in 0..self.sentinels.len() {
            let _: () = cmd.query(&mut self.sentinel(i).unwrap()).unwrap();
        }
    }

    /// A field of `SENTINEL MASTER` as sentinel `i` sees it.
    fn sentinel_field(&self, i: usize, field: &str) -> Option<String> {
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER)
            .query(&mut self.sentinel(i).ok()?)
            .ok()?;
        let at = fields.iter().position(|f| f == field)?;
        fields.get(at + 1).cloned()
    }

    /// A plain connection to the data node on `port`.
    pub fn node(&self, port: u16) -> redis::Connection {
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |p| format!(":{p}@"));
        redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap()
    }

    /// What the data node on `port` says it is.
    pub fn role(&self, port: u16) -> String {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut self.node(port)).unwrap();
        match &role[0] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into(),
            other => panic!("ROLE answered {other:?}"),
        }
    }

    /// A failover now, without waiting for the master to fail (`SENTINEL FAILOVER`).
    pub fn failover(&self) {
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER)
            .query(&mut self.sentinel(0).unwrap())
            .unwrap();
    }

    /// Waits until `ready` holds, failing the test past `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, ready: impl Fn(&Group) -> bool) {
        let deadline = Instant::now() + timeout;
        while !ready(self) {
            assert!(Instant::now() < deadline, "no {what} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
