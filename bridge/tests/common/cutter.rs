//! A TCP proxy in front of Redis that loses one script call's answer on demand: once armed,
//! it forwards the next `EVALSHA` to Redis, which runs it, and then closes the connection
//! instead of passing the answer on, as a network failure at the worst moment would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Cutter {
    pub addr: SocketAddr,
    armed: Arc<AtomicBool>,
}

impl Cutter {
    pub async fn start(redis: SocketAddr) -> Cutter {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let arming = Arc::clone(&armed);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(redis).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, Arc::clone(&arming)));
            }
        });
        Cutter { addr, armed }
    }

    /// Loses the answer to the next script call.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let script_sent = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf).await {
            if armed.load(Ordering::SeqCst) && buf[..n].windows(7).any(|w| w == b"EVALSHA") {
                script_sent.store(true, Ordering::SeqCst);
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf).await {
            if script_sent.load(Ordering::SeqCst) && armed.swap(false, Ordering::SeqCst) {
                return; // the answer is dropped, and the connection with it
            }
            if to_client.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
