//! A TLS-terminating proxy in front of a plaintext server. The Valkey wheel is built without
//! TLS, so the tests reach a real Valkey over `rediss://` through this: it presents a server
//! certificate, can demand a client certificate, and counts the handshakes it completed, so a
//! test can tell that traffic really went through TLS.

use crate::pki::{Ca, Identity};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

/// The proxy, on a free loopback port, running on its own thread until dropped.
pub struct TlsProxy {
    pub port: u16,
    handshakes: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsProxy {
    /// Accepts TLS as `server` and forwards each connection whose handshake succeeded to
    /// `target` in plaintext. With `clients`, a client certificate issued by that CA is
    /// required.
    pub fn start(target: SocketAddr, server: &Identity, clients: Option<&Ca>) -> TlsProxy {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(server, clients)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("local address").port();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&handshakes);
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                let serve = async {
                    loop {
                        if let Ok((conn, _)) = listener.accept().await {
                            let (acceptor, counter) = (acceptor.clone(), Arc::clone(&counter));
                            tokio::spawn(forward(acceptor, conn, target, counter));
                        }
                    }
                };
                tokio::select! {
                    _ = stopped => {}
                    () = serve => {}
                }
            });
        });
        TlsProxy {
            port,
            handshakes,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// TLS handshakes completed so far (each one then forwarded).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Dropping the runtime with the thread closes every forwarded connection.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A server configuration presenting `server`, requiring a client certificate issued by
/// `clients` if given.
pub fn server_config(server: &Identity, clients: Option<&Ca>) -> ServerConfig {
    let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("server certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).expect("server key PEM");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.der()).expect("client CA");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(chain, key)
        .expect("server certificate and key")
}

async fn forward(
    acceptor: TlsAcceptor,
    conn: TcpStream,
    target: SocketAddr,
    handshakes: Arc<AtomicUsize>,
) {
    let Ok(mut tls) = acceptor.accept(conn).await else {
        return;
    };
    handshakes.fetch_add(1, Ordering::SeqCst);
    let Ok(mut plain) = TcpStream::connect(target).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Valkey;
    use rustls::pki_types::ServerName;
    use rustls::ClientConfig;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;

    /// PING through `proxy` as a rustls client trusting `ca`; what came back, if anything.
    async fn ping(proxy: &TlsProxy, ca: &Ca, identity: Option<&Identity>) -> Vec<u8> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.der()).unwrap();
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(id.cert_pem.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let Ok(mut tls) = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
        else {
            return Vec::new();
        };
        let mut reply = vec![0u8; 7];
        let exchange = async {
            tls.write_all(b"PING\r\n").await?;
            tls.read_exact(&mut reply).await
        };
        match exchange.await {
            Ok(_) => reply,
            Err(_) => Vec::new(),
        }
    }

    #[test]
    fn forwards_trusted_handshakes_and_demands_client_certificates_when_told() {
        let valkey = Valkey::start();
        let ca = Ca::new("test CA");
        let server = ca.server(&["127.0.0.1", "localhost"]);
        let open = TlsProxy::start(valkey.addr(), &server, None);
        let mutual = TlsProxy::start(valkey.addr(), &server, Some(&ca));
        let client = ca.client("bridge");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert_eq!(ping(&open, &ca, None).await, b"+PONG\r\n");
            assert_eq!(open.handshakes(), 1);
            assert_eq!(ping(&mutual, &ca, Some(&client)).await, b"+PONG\r\n");
            assert_eq!(ping(&mutual, &ca, None).await, b"");
            assert_eq!(
                mutual.handshakes(),
                1,
                "no forwarding without a certificate"
            );
            let stranger = Ca::new("another CA");
            assert_eq!(ping(&open, &stranger, None).await, b"", "untrusted server");
        });
    }
}
