//! TLS on the bridge's own port (`--tls-cert`, `--tls-key`, `--tls-client-ca`): what Envoy
//! Gateway's managed rate limit service serves (`GRPC_SERVER_USE_TLS`, with the gateways'
//! client certificates checked), and what any deployment whose gateways reach the bridge
//! across a network it does not trust wants. ALPN offers HTTP/2 first, then HTTP/1.1, so
//! every transport of the plaintext port works the same over TLS.

use crate::ops::pem;
use clap::Args;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

const CERT_FLAG: &str = "--tls-cert";
const KEY_FLAG: &str = "--tls-key";
const CLIENT_CA_FLAG: &str = "--tls-client-ca";

/// The listener's TLS flags.
#[derive(Args, Debug, Clone, Default)]
pub struct ListenTlsArgs {
    /// Serve TLS on --listen with this PEM certificate chain (leaf first), instead of
    /// plaintext; needs --tls-key.
    #[arg(long, env = "RATELIMIT_BRIDGE_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "RATELIMIT_BRIDGE_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Require every client to present a certificate issued by one of these CAs (PEM
    /// bundle): mutual TLS. Needs --tls-cert.
    #[arg(long, env = "RATELIMIT_BRIDGE_TLS_CLIENT_CA", value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ListenTlsArgs {
    /// The acceptor the flags describe, their files read and checked; `None` for plaintext.
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>, String> {
        let identity = pem::optional_identity(
            (CERT_FLAG, self.tls_cert.as_deref()),
            (KEY_FLAG, self.tls_key.as_deref()),
        )?;
        let Some(identity) = identity else {
            return match self.tls_client_ca {
                Some(_) => Err(format!("{CLIENT_CA_FLAG} needs {CERT_FLAG}")),
                None => Ok(None),
            };
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("{CERT_FLAG}: {e}"))?;
        let builder = match &self.tls_client_ca {
            Some(path) => {
                let (_, roots) = pem::trust_anchors(CLIENT_CA_FLAG, path)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("{CLIENT_CA_FLAG} {}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(identity.chain, identity.key)
            .map_err(|e| format!("{CERT_FLAG}: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(TlsAcceptor::from(Arc::new(config))))
    }
}
