//! The store in Redis Cluster mode, on a one-node Valkey Cluster holding every slot: a
//! batch costs one script call per slot, and a check spanning slots stays all-or-nothing
//! through refunds even when other checks of the batch share its buckets. (Several nodes,
//! failover and node routing are the testbed's `test_cluster.py`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use ratelimit_bridge::slot::slot;
use ratelimit_bridge::store::{Store, StoreOptions};
use ratelimit_bridge::wire::{Check, RuleSpec};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `valkey-server --cluster-enabled yes` that owns all 16384 slots, killed when dropped.
struct OneNodeCluster {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl OneNodeCluster {
    fn start() -> OneNodeCluster {
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

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cmd<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
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

fn rule(key: &str, burst: u64) -> RuleSpec {
    RuleSpec {
        key: key.into(),
        burst,
        num: 1,
        den: 3_600_000,
        cost: 1,
    }
}

#[tokio::test]
async fn a_check_denied_in_one_slot_is_refunded_in_the_others_within_a_batch() {
    let node = OneNodeCluster::start();
    let options = StoreOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
    };
    let store = Store::cluster(&[node.url()], options).unwrap();
    let (roomy, tight) = (rule("{a}user", 10), rule("{b}ip", 1));
    assert_ne!(slot(roomy.key.as_bytes()), slot(tight.key.as_bytes()));
    let warm = store.check(&vec![rule("{a}warm-up", 1)]).await.unwrap();
    assert!(warm.1[0].allowed, "the script is loaded");
    let _: () = node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));

    let both: Check = vec![roomy.clone(), tight];
    let out: Vec<_> = store
        .check_all(&[both.clone(), both, vec![roomy]])
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let allowed: Vec<Vec<bool>> = out
        .iter()
        .map(|(_, o)| o.iter().map(|r| r.allowed).collect())
        .collect();
    // The second check is denied by {b}; {a} admitted its part and gave it back.
    assert_eq!(allowed, [vec![true, true], vec![true, false], vec![true]]);
    // {a}'s call applied the three parts in order (9, 8, 7 left), then the refund: 8.
    assert_eq!(out[2].1[0].remaining, 7);
    assert_eq!(
        out[1].1[0].remaining, 8,
        "the refunded rule reports its bucket"
    );
    let value: Vec<u8> = node.cmd(redis::cmd("GET").arg("{a}user"));
    let units = f64::from_le_bytes(value[1..9].try_into().unwrap());
    assert_eq!(units as u64 / 3_600_000, 8);
    // One call per slot, then one refund call.
    let info: String = node.cmd(redis::cmd("INFO").arg("commandstats"));
    assert!(
        info.contains("cmdstat_evalsha:calls=3,"),
        "{}",
        info.lines().find(|l| l.contains("evalsha")).unwrap_or("")
    );
}
