//! The bridge's server in-process on a free port, against a given Redis, stopped on demand.

use ratelimit_bridge::limits::Limits;
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

/// Deadlines far longer than any test, so that only the tests about them see them.
pub const RELAXED: Limits = Limits {
    header_timeout: Duration::from_secs(60),
    body_timeout: Duration::from_secs(60),
    max_connections: 1024,
};

pub async fn start(redis_url: &str) -> Bridge {
    start_with(redis_url, RELAXED).await
}

pub async fn start_with(redis_url: &str, limits: Limits) -> Bridge {
    let options = StoreOptions {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_secs(2),
    };
    let store = Store::new(redis_url, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server::run(listener, store, limits, async move {
        let _ = stopped.await;
    }));
    Bridge {
        addr,
        stop: Some(stop),
        task,
    }
}
