//! The bridge's server in-process on a free port, against a given Redis, stopped on demand.

use ratelimit_bridge::server;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub struct Bridge {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

pub async fn start(redis_url: &str) -> Bridge {
    let options = StoreOptions {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_secs(2),
    };
    let store = Store::new(redis_url, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server::run(listener, store, async move {
        let _ = stopped.await;
    }));
    Bridge {
        addr,
        stop: Some(stop),
        task,
    }
}
