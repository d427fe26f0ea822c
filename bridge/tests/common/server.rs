//! The bridge's server in-process on a free port, against a given Redis, stopped on demand.

use ratelimit_bridge::doors::guards::access::Access;
use ratelimit_bridge::doors::guards::deadlines::ConnectionBounds;
use ratelimit_bridge::doors::server::{self, Config};
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub struct Bridge {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Deadlines far longer than any test, so that only the tests about them see them.
pub const RELAXED: ConnectionBounds = ConnectionBounds {
    header_timeout: Duration::from_secs(60),
    body_timeout: Duration::from_secs(60),
    write_timeout: Duration::from_secs(60),
    max_connections: 1024,
    max_pending_mib: 256,
};

/// Open to every caller, with `limits`.
pub fn without_token(bounds: ConnectionBounds) -> Config {
    Config {
        bounds,
        access: Access::open(),
        admin: Access::open(),
        plugin: None,
        rls: None,
        tls: None,
    }
}

/// Serving only callers that present `token`, read from a token file as the binary does.
pub async fn start_with_token(redis_url: &str, token: &str) -> Bridge {
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "ratelimit-token-{}-{}",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, format!("{token}\n")).unwrap();
    let access = Access::from_token_file(&path);
    std::fs::remove_file(&path).unwrap();
    let config = Config {
        bounds: RELAXED,
        access: access.unwrap(),
        admin: Access::open(),
        plugin: None,
        rls: None,
        tls: None,
    };
    start_with(redis_url, config).await
}

pub async fn start(redis_url: &str) -> Bridge {
    start_with(redis_url, without_token(RELAXED)).await
}

pub async fn start_with(redis_url: &str, config: Config) -> Bridge {
    let options = StoreOptions {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_secs(2),
    };
    let store = Store::new(redis_url, options).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server::run(
        listener,
        Engine::new(store, None),
        config,
        async move {
            let _ = stopped.await;
        },
    ));
    Bridge {
        addr,
        stop: Some(stop),
        task,
    }
}
