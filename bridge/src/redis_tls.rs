//! TLS to Redis (`rediss://`) through redis-rs's rustls support: the crypto provider, and
//! the PEM files of `--redis-ca-file` and `--redis-client-cert` / `--redis-client-key`.
//!
//! The files are read and checked once, at startup, so that a bad file stops the bridge with
//! the flag's name; redis-rs would otherwise accept, say, a CA file without a certificate and
//! fail every connection later with an unknown issuer.

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use std::path::{Path, PathBuf};

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
        let client_tls = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(identity(cert, key)?),
            (Some(_), None) => return Err(format!("{CERT_FLAG} needs {KEY_FLAG}")),
            (None, Some(_)) => return Err(format!("{KEY_FLAG} needs {CERT_FLAG}")),
        };
        let root_cert = self.ca_file.as_deref().map(trust_anchors).transpose()?;
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

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

fn certificates(
    flag: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: unreadable PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no certificate in the file (expected PEM blocks \
             `-----BEGIN CERTIFICATE-----`)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The CA file, once every certificate in it is known to be a usable trust anchor.
fn trust_anchors(path: &Path) -> Result<Vec<u8>, String> {
    let pem = read(CA_FLAG, path)?;
    let mut roots = RootCertStore::empty();
    for (n, cert) in certificates(CA_FLAG, path, &pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "{CA_FLAG} {}: certificate {} is no usable CA certificate: {e}",
                path.display(),
                n + 1
            )
        })?;
    }
    Ok(pem)
}

/// The client certificate and key, once rustls accepts the key and finds that it belongs to
/// the certificate.
fn identity(cert_path: &Path, key_path: &Path) -> Result<ClientTlsConfig, String> {
    let client_cert = read(CERT_FLAG, cert_path)?;
    let chain = certificates(CERT_FLAG, cert_path, &client_cert)?;
    let client_key = read(KEY_FLAG, key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&client_key)
        .map_err(|e| format!("{KEY_FLAG} {}: no PEM private key: {e}", key_path.display()))?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(|e| {
        format!(
            "{KEY_FLAG} {} does not go with {CERT_FLAG} {}: {e}",
            key_path.display(),
            cert_path.display()
        )
    })?;
    Ok(ClientTlsConfig {
        client_cert,
        client_key,
    })
}
