//! Certificates made at test time, so that no key sits in the repository and none expires: a
//! CA, the certificates it issues to servers and to clients, and a scratch directory for the
//! PEM files the bridge's flags read.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A certificate authority with its signing key.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate, PEM (what `--redis-ca-file` holds).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.der.clone()
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> Identity {
        self.issue(names, "server", ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate, for mutual TLS.
    pub fn client(&self, name: &str) -> Identity {
        self.issue(&[], name, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: &[&str], cn: &str, usage: ExtendedKeyUsagePurpose) -> Identity {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("issue");
        Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A fresh directory under the system's temporary directory, removed when dropped.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratelimit-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch { dir }
    }

    /// Writes `contents` to `name` in the directory; returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).expect("write a scratch file");
        path
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
