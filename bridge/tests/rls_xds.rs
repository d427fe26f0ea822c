//! The bridge as Envoy Gateway runs its rate limit service: the binary started with the
//! environment Envoy Gateway's Deployment sets for envoyproxy/ratelimit (configuration over
//! xDS with mutual TLS, TLS on the gRPC port, probes and Prometheus on ports of their own),
//! configured by an xDS server playing Envoy Gateway's part (there is no Envoy Gateway on
//! these machines), answering `ShouldRateLimit` over TLS from a real Valkey.

use crate::common::prefixed;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use ratelimit_bridge::doors::rls::proto::{
    Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, CODE_OK, CODE_OVER_LIMIT,
};
use ratelimit_bridge::doors::rls::xds::proto::{
    Any, DiscoveryRequest, DiscoveryResponse, RateLimitConfig, RateLimitDescriptor as Configured,
    RateLimitPolicy, PATH, TYPE_URL,
};
use ratelimit_protocol::Deframer;
use rustls::pki_types::ServerName;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use test_support::pki::{Ca, Identity, Scratch};
use test_support::tls_proxy::server_config;
use test_support::{free_port, Valkey};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const BINARY: &str = env!("CARGO_BIN_EXE_ratelimit-bridge");
const WAIT: Duration = Duration::from_secs(20);

/// One subscription the xDS server took: the requests that came on it, and where the
/// test pushes responses (dropping it ends the stream).
struct Call {
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    push: mpsc::Sender<Bytes>,
}

impl Call {
    async fn next(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("a request within the wait")
            .expect("the stream is open")
    }

    async fn send(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources: configs
                .iter()
                .map(|c| Any {
                    type_url: TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            type_url: TYPE_URL.into(),
            nonce: nonce.into(),
        };
        self.push
            .send(prefixed(&response.encode_to_vec()))
            .await
            .unwrap();
    }
}

/// An xDS server on a free port, serving `StreamAggregatedResources` over TLS as `server`
/// to clients with a certificate of `clients`; each call it takes comes out of the receiver.
async fn xds_server(server: &Identity, clients: &Ca) -> (u16, mpsc::UnboundedReceiver<Call>) {
    let mut config = server_config(server, Some(clients));
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (calls, taken) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, calls) = (acceptor.clone(), calls.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let calls = calls.clone();
                    async move {
                        assert_eq!(req.uri().path(), PATH);
                        let (requests, seen) = mpsc::unbounded_channel();
                        let (push, pushed) = mpsc::channel::<Bytes>(8);
                        let _ = calls.send(Call {
                            requests: seen,
                            push,
                        });
                        let mut body = req.into_body();
                        tokio::spawn(async move {
                            let mut deframer = Deframer::default();
                            while let Some(Ok(frame)) = body.frame().await {
                                if let Ok(data) = frame.into_data() {
                                    deframer.push(&data);
                                    while let Some(m) = deframer.next_message().unwrap() {
                                        let _ = requests
                                            .send(DiscoveryRequest::decode(m.as_slice()).unwrap());
                                    }
                                }
                            }
                        });
                        let frames = stream::unfold(pushed, |mut pushed| async move {
                            let message = pushed.recv().await?;
                            Some((Ok::<_, Infallible>(Frame::data(message)), pushed))
                        });
                        let mut response = Response::new(StreamBody::new(frames));
                        response
                            .headers_mut()
                            .insert("content-type", "application/grpc".parse().unwrap());
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, taken)
}

fn limit(domain: &str, key: &str, per_unit: u32, unit: i32) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{domain}-config"),
        domain: domain.into(),
        descriptors: vec![Configured {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: per_unit,
                ..RateLimitPolicy::default()
            }),
            ..Configured::default()
        }],
    }
}

/// The bridge process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ShouldRateLimit` for `user` in `domain`, over TLS trusting `ca`: the overall code.
async fn should_rate_limit(port: u16, ca: &Ca, domain: &str, user: &str) -> i32 {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let message = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let request = Request::post(format!(
        "https://localhost{}",
        ratelimit_bridge::doors::rls::proto::PATH
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(prefixed(&message.encode_to_vec())))
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let mut deframer = Deframer::default();
    deframer.push(&body);
    let message = deframer
        .next_message()
        .unwrap()
        .expect("a response message");
    RateLimitResponse::decode(message.as_slice())
        .unwrap()
        .overall_code
}

/// `GET path` on a plaintext port: the status line and the body.
fn get(port: u16, path: &str) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_serves_limits_pushed_over_xds() {
    let valkey = Valkey::start();
    let ca = Ca::new("envoy-gateway-ca");
    let (xds_port, mut calls) = xds_server(&ca.server(&["localhost"]), &ca).await;
    // Envoy Gateway mounts one certificate for both sides, as here.
    let own = ca.client("envoy-ratelimit");
    let served = ca.server(&["localhost"]);
    let dir = Scratch::new();
    let ca_file = dir.write("ca.crt", ca.pem());
    let (client_cert, client_key) = (
        dir.write("client.crt", &own.cert_pem),
        dir.write("client.key", &own.key_pem),
    );
    let (cert, key) = (
        dir.write("tls.crt", &served.cert_pem),
        dir.write("tls.key", &served.key_pem),
    );
    let (grpc, http, prometheus) = (free_port(), free_port(), free_port());
    let path = |p: &std::path::Path| p.display().to_string();
    let log = dir.path().join("stderr.log");
    let env: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", path(dir.path())),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("localhost:{xds_port}"),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", path(&cert)),
        ("GRPC_SERVER_TLS_KEY", path(&key)),
        ("GRPC_SERVER_TLS_CA_CERT", path(&ca_file)),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&client_cert)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&client_key)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&ca_file)),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", valkey.addr().to_string()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        // Loopback rather than every address, on free ports.
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", http.to_string()),
        ("RUST_LOG", "info".into()),
    ];
    let _bridge = Process(
        Command::new(BINARY)
            .env_clear()
            .envs(env)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(&log).unwrap_or_default();

    let mut call = tokio::time::timeout(WAIT, calls.recv())
        .await
        .unwrap_or_else(|_| panic!("no subscription; the bridge said:\n{}", log()))
        .unwrap();
    let first = call.next().await;
    // The bridge subscribes before it listens: its gRPC port is called once it says so.
    let listening = async {
        while !(log().contains("listening on")
            && TcpStream::connect(("127.0.0.1", grpc)).await.is_ok())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, listening)
        .await
        .unwrap_or_else(|_| panic!("the bridge did not listen; it said:\n{}", log()));
    assert_eq!(first.node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("", "")
    );
    // Before any configuration: no limit, as with FORCE_START_WITHOUT_INITIAL_CONFIG.
    assert_eq!(should_rate_limit(grpc, &ca, "api", "alice").await, CODE_OK);

    call.send("1", "n1", &[limit("api", "user", 2, 2)]).await;
    let ack = call.next().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(ack.error_detail.is_none(), "{ack:?}");
    let codes = [
        should_rate_limit(grpc, &ca, "api", "bob").await,
        should_rate_limit(grpc, &ca, "api", "bob").await,
        should_rate_limit(grpc, &ca, "api", "bob").await,
    ];
    assert_eq!(codes, [CODE_OK, CODE_OK, CODE_OVER_LIMIT]);

    // A configuration that does not load (a limit with no unit) is refused whole, with
    // the line check-config prints, and the one in force stays.
    call.send(
        "2",
        "n2",
        &[limit("api", "user", 100, 2), limit("web", "user", 1, 0)],
    )
    .await;
    let nack = call.next().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", "n2")
    );
    let why = nack.error_detail.expect("a NACK says why").message;
    assert!(
        why.contains("\"web-config\"") && why.contains("no unit"),
        "{why}"
    );
    assert_eq!(
        should_rate_limit(grpc, &ca, "api", "bob").await,
        CODE_OVER_LIMIT
    );

    call.send(
        "3",
        "n3",
        &[limit("api", "user", 100, 2), limit("web", "user", 1, 2)],
    )
    .await;
    let ack = call.next().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("3", "n3")
    );
    assert_eq!(should_rate_limit(grpc, &ca, "web", "carol").await, CODE_OK);
    assert_eq!(
        should_rate_limit(grpc, &ca, "web", "carol").await,
        CODE_OVER_LIMIT
    );

    // The server ends the stream: the bridge subscribes again, asking for what it has.
    drop(call);
    let mut call = tokio::time::timeout(WAIT, calls.recv())
        .await
        .unwrap()
        .unwrap();
    let again = call.next().await;
    assert_eq!(again.version_info, "3");
    assert_eq!(
        should_rate_limit(grpc, &ca, "web", "carol").await,
        CODE_OVER_LIMIT
    );

    // Probes where Envoy Gateway's Deployment points them, in plaintext.
    let health = get(http, "/healthcheck");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = get(prometheus, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("ratelimit_bridge_rls_over_limit_total{domain=\"web\",key=\"user\"} 2"),
        "{metrics}"
    );
    assert!(get(http, "/v1/check").starts_with("HTTP/1.1 404"));
    // The gRPC port speaks TLS only.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", grpc)).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: b\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "plaintext was served");
}
