//! TLS to Redis (`rediss://`) through redis-rs's rustls support: the crypto provider, and
//! the PEM files of `--redis-ca-file` and `--redis-client-cert` / `--redis-client-key`.
//!
//! The files are read and checked once, at startup, so that a bad file stops the bridge with
//! the flag's name; redis-rs would otherwise accept, say, a CA file without a certificate and
//! fail every connection later with an unknown issuer.

use crate::ops::pem;
use redis::{ClientTlsConfig, TlsCertificates};
use std::path::PathBuf;

const CA_FLAG: &str = "--redis-ca-file";
const CERT_FLAG: &str = "--redis-client-cert";
const KEY_FLAG: &str = "--redis-client-key";

/// Where the trust in Redis's certificate and the bridge's own certificate come from. With
/// no file, the system's roots (rustls-native-certs) and no client certificate.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM bundle of the CAs to trust, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to Redis (mutual TLS), leaf first.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert` (PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is given.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }

    /// The files' contents as redis-rs takes them, checked; `None` without any file.
    pub fn load(&self) -> Result<Option<TlsCertificates>, String> {
        let client_tls = pem::optional_identity(
            (CERT_FLAG, self.client_cert.as_deref()),
            (KEY_FLAG, self.client_key.as_deref()),
        )?
        .map(|id| ClientTlsConfig {
            client_cert: id.cert_pem,
            client_key: id.key_pem,
        });
        let root_cert = self
            .ca_file
            .as_deref()
            .map(|path| pem::trust_anchors(CA_FLAG, path).map(|(pem, _)| pem))
            .transpose()?;
        if client_tls.is_none() && root_cert.is_none() {
            return Ok(None);
        }
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// Makes ring the process's rustls provider. redis-rs builds its TLS configurations with the
/// process default, which rustls would refuse to pick if feature unification ever compiled in
/// a second provider (aws-lc-rs); ring needs no cmake and builds fast. A provider installed
/// earlier by someone else stays, hence the ignored result.
pub fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
