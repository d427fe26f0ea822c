//! Peers that do not read what the bridge sends them (HTTP/2 with a window of 0): they can
//! neither keep a gateway out of the connection slots nor grow the bridge's memory past its
//! bound. Waits are several seconds longer than the deadline they wait for.

use crate::common::client::{h2c, req};
use crate::common::prefixed;
use crate::common::process::BridgeProcess;
use crate::common::server::{start_with, RELAXED};
use crate::common::stream::{open_at, receiver_stream};
use crate::common::Valkey;
use bytes::Bytes;
use http_body_util::{Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratelimit_bridge::doors::guards::access::Access;
use ratelimit_bridge::doors::guards::deadlines::ConnectionBounds;
use ratelimit_bridge::doors::server::Config;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const SLACK: Duration = Duration::from_secs(5);
const TOKEN: &str = "gateways-Token";

/// An HTTP/2 connection whose peer grants the bridge no window to send in: every answer's
/// body stays unsent. Its task ends when the bridge closes the connection.
async fn unreading<B>(
    addr: SocketAddr,
) -> (hyper::client::conn::http2::SendRequest<B>, JoinHandle<()>)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(io)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

/// A token file of its own for each caller: the tests run at once, and a file written while
/// another test reads it reads empty.
fn token_file() -> std::path::PathBuf {
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("ratelimit-unread-token-{}-{n}", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, TOKEN).unwrap();
    path
}

#[tokio::test]
async fn unauthenticated_peers_that_never_read_cannot_keep_a_gateway_out() {
    let valkey = Valkey::start();
    let header_timeout = Duration::from_secs(1);
    let config = Config {
        bounds: ConnectionBounds {
            header_timeout,
            max_connections: 16,
            ..RELAXED
        },
        access: Access::from_token_file(&token_file()).unwrap(),
        admin: Access::open(),
        plugin: None,
        rls: None,
        tls: None,
    };
    let bridge = start_with(&valkey.url(), config).await;
    // Every slot: a request without the token (401) or a health check, whose answer can
    // never be sent.
    let mut held = Vec::new();
    for i in 0..16 {
        let (mut sender, task) = unreading(bridge.addr).await;
        let path = if i % 2 == 0 { "/v1/check" } else { "/healthz" };
        let response = sender.send_request(req(Method::POST, path, "rl:k,1,1,1000,1\n"));
        let response = tokio::time::timeout(SLACK, response)
            .await
            .unwrap()
            .unwrap();
        assert!(
            [StatusCode::UNAUTHORIZED, StatusCode::METHOD_NOT_ALLOWED].contains(&response.status()),
            "{}",
            response.status()
        );
        held.push((sender, task, response));
    }
    // A gateway connecting now is served at once.
    let check = Request::post("/v1/check")
        .header("host", "bridge")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::from_static(b"rl:gw,5,1,1000,1\n")))
        .unwrap();
    let (status, reply) = tokio::time::timeout(SLACK, h2c(bridge.addr, check))
        .await
        .expect("a gateway is answered while the slots are held");
    assert_eq!(status, StatusCode::OK, "{reply}");
    // And every peer that holds an answer it does not read is closed by the header
    // deadline: an answer it never reads is no request in progress.
    let deadline = Instant::now() + header_timeout + SLACK;
    for (_, task, _) in held {
        tokio::time::timeout_at(deadline, task)
            .await
            .expect("an unreading connection is closed")
            .unwrap();
    }
}

/// A gRPC stream with the token on a connection that never reads what the bridge sends.
async fn unreading_stream(addr: SocketAddr) -> Attacker {
    let (mut sender, task) = unreading(addr).await;
    let (send, frames) = mpsc::channel(4);
    let body = StreamBody::new(receiver_stream(frames));
    let request = Request::post("http://bridge/ratelimit.v1.Bridge/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(body)
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    Attacker {
        send,
        task,
        _response: response,
        _sender: sender,
    }
}

/// What a peer holds open: dropping any of it would close the stream.
struct Attacker {
    send: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    task: JoinHandle<()>,
    _response: Response<Incoming>,
    _sender: hyper::client::conn::http2::SendRequest<StreamBody<Frames>>,
}

type Frames =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>;

/// The bridge process's resident memory, in MiB.
fn rss_mib(bridge: &BridgeProcess) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

/// A message of about 26 KiB: 52 checks of one bucket each, keys near 500 bytes.
fn big_message(id: u32, stream: usize) -> Bytes {
    let mut body = format!("{id}\n");
    for line in 0..52 {
        let pad = "p".repeat(470);
        body.push_str(&format!("rl:s{stream}-{line}-{pad},1000000,1,1,1\n"));
    }
    prefixed(body.as_bytes())
}

#[tokio::test]
async fn token_holders_that_never_read_replies_are_cut_off_and_memory_stays_bounded() {
    let valkey = Valkey::start();
    let token = token_file();
    let bridge = BridgeProcess::start(&[
        "--redis",
        &valkey.url(),
        "--token-file",
        token.to_str().unwrap(),
        "--write-timeout-ms",
        "2000",
        "--max-pending-mib",
        "32",
    ]);
    let before = rss_mib(&bridge);
    // A gateway that reads, beside 20 streams that never do.
    let (status, mut gateway) = open_at(bridge.addr, Some(&format!("Bearer {TOKEN}"))).await;
    assert_eq!(status, StatusCode::OK);
    let mut attackers = Vec::new();
    for _ in 0..20 {
        attackers.push(unreading_stream(bridge.addr).await);
    }
    let feeding: Vec<_> = attackers
        .iter()
        .enumerate()
        .map(|(n, attacker)| {
            let send = attacker.send.clone();
            tokio::spawn(async move {
                for id in 0.. {
                    if send
                        .send(Ok(Frame::data(big_message(id, n))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            })
        })
        .collect();
    let mut peak = before;
    let start = Instant::now();
    let mut answered = 0;
    while start.elapsed() < Duration::from_secs(10) {
        gateway
            .send(&format!("{answered}\nrl:gw,1000000,1,1,1\n"))
            .await;
        let reply = tokio::time::timeout(SLACK, gateway.next())
            .await
            .expect("the gateway is answered during the attack")
            .unwrap();
        assert!(reply.starts_with(&format!("{answered}\n")), "{reply}");
        answered += 1;
        peak = peak.max(rss_mib(&bridge));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every connection that stopped reading was closed by the write deadline.
    for attacker in &mut attackers {
        tokio::time::timeout(SLACK, &mut attacker.task)
            .await
            .expect("a connection that does not read its replies is closed")
            .unwrap();
    }
    for feeder in feeding {
        feeder.abort();
    }
    eprintln!("bridge RSS {before} MiB before the attack, {peak} MiB at its peak");
    assert!(
        peak < before + 32 + 48,
        "bridge RSS {before} MiB before, {peak} MiB at the peak"
    );
}
