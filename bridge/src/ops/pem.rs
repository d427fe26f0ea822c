//! PEM files named by flags, read and checked once at startup so that a bad file stops the
//! bridge with the flag's name rather than failing every connection later: certificate
//! chains, private keys that must go with them, and CA bundles. Shared by TLS to Redis
//! (`redis_tls`), TLS on the bridge's own port (`listen_tls`) and the rate limit service's
//! xDS client (`rls::xds`).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use std::path::Path;

/// The file's bytes.
pub fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// The certificates of a PEM file (`pem`, read from `path`), at least one.
pub fn certificates(
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

/// A CA bundle, once every certificate in it is known to be a usable trust anchor.
pub fn trust_anchors(flag: &str, path: &Path) -> Result<(Vec<u8>, RootCertStore), String> {
    let pem = read(flag, path)?;
    let mut roots = RootCertStore::empty();
    for (n, cert) in certificates(flag, path, &pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "{flag} {}: certificate {} is no usable CA certificate: {e}",
                path.display(),
                n + 1
            )
        })?;
    }
    Ok((pem, roots))
}

/// A certificate chain and its private key, once rustls accepts the key and finds that it
/// belongs to the certificate.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The two files as read, for clients that take PEM.
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// The identity of `cert_flag` and `key_flag`.
pub fn identity(
    (cert_flag, cert_path): (&str, &Path),
    (key_flag, key_path): (&str, &Path),
) -> Result<Identity, String> {
    let cert_pem = read(cert_flag, cert_path)?;
    let chain = certificates(cert_flag, cert_path, &cert_pem)?;
    let key_pem = read(key_flag, key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("{key_flag} {}: no PEM private key: {e}", key_path.display()))?;
    CertifiedKey::from_der(
        chain.clone(),
        key.clone_key(),
        &rustls::crypto::ring::default_provider(),
    )
    .map_err(|e| {
        format!(
            "{key_flag} {} does not go with {cert_flag} {}: {e}",
            key_path.display(),
            cert_path.display()
        )
    })?;
    Ok(Identity {
        chain,
        key,
        cert_pem,
        key_pem,
    })
}

/// Both files of an identity or neither: `None` for neither.
pub fn optional_identity(
    (cert_flag, cert): (&str, Option<&Path>),
    (key_flag, key): (&str, Option<&Path>),
) -> Result<Option<Identity>, String> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => identity((cert_flag, cert), (key_flag, key)).map(Some),
        (Some(_), None) => Err(format!("{cert_flag} needs {key_flag}")),
        (None, Some(_)) => Err(format!("{key_flag} needs {cert_flag}")),
    }
}
