//! A one-node Valkey Cluster for the tests of the store in cluster mode.

use super::Connect;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
