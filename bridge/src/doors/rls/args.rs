//! The rate limit service's flags (`RlsArgs`): where its configuration comes from (files, or
//! an xDS server as Envoy Gateway runs one) and what its answers add, and the service they
//! make.

use super::answer::{Headers, ResponseHeaders};
use super::xds::Server;
use super::{Options, Rls};
use crate::ops::pem;
use clap::Args;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::TlsConnector;

const XDS_CA_FLAG: &str = "--rls-xds-ca";
const XDS_CERT_FLAG: &str = "--rls-xds-client-cert";
const XDS_KEY_FLAG: &str = "--rls-xds-client-key";

#[derive(Args, Debug, Clone)]
pub struct RlsArgs {
    /// Serve Envoy's Rate Limit Service (`ShouldRateLimit`, gRPC on this port) from
    /// envoyproxy/ratelimit's YAML configuration: one file, or a directory of them,
    /// reloaded when they change.
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_CONFIG", value_name = "PATH")]
    pub rls_config: Option<PathBuf>,
    /// Serve Envoy's Rate Limit Service with its configuration from this xDS server
    /// (`host:port`, `RateLimitConfig` resources over `StreamAggregatedResources`, state of
    /// the world), as Envoy Gateway serves its rate limit service's.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_XDS",
        value_name = "HOST:PORT",
        conflicts_with = "rls_config"
    )]
    pub rls_xds: Option<String>,
    /// The node id to subscribe as (Envoy Gateway keys its snapshot on `envoy-ratelimit`).
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_XDS_NODE",
        value_name = "ID",
        default_value = "default"
    )]
    pub rls_xds_node: String,
    /// Reach the xDS server over TLS (implied by any --rls-xds-* file).
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_XDS_TLS")]
    pub rls_xds_tls: bool,
    /// PEM bundle of the CAs the xDS server's certificate must chain to (else the
    /// system's roots).
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_XDS_CA", value_name = "PEM")]
    pub rls_xds_ca: Option<PathBuf>,
    /// PEM certificate chain presented to the xDS server (mutual TLS; needs the key).
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_XDS_CLIENT_CERT", value_name = "PEM")]
    pub rls_xds_client_cert: Option<PathBuf>,
    /// The PEM private key of --rls-xds-client-cert.
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_XDS_CLIENT_KEY", value_name = "PEM")]
    pub rls_xds_client_key: Option<PathBuf>,
    /// The name the xDS server's certificate must carry (else the host of --rls-xds).
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_XDS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub rls_xds_server_name: Option<String>,
    /// The headers the rate limit service asks Envoy to add to responses: the bridge's
    /// `X-RateLimit-*` (draft03), envoyproxy/ratelimit's `RateLimit-*` (reference), or none.
    /// Started from envoyproxy/ratelimit's environment (`RUNTIME_ROOT`), its
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` decides instead of this default: reference or off.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_RESPONSE_HEADERS",
        value_enum,
        default_value = "draft03"
    )]
    pub rls_response_headers: ResponseHeaders,
    /// The name of the limit's header with `--rls-response-headers reference`.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_LIMIT_HEADER",
        value_name = "NAME",
        default_value = "RateLimit-Limit"
    )]
    pub rls_limit_header: String,
    /// The name of the remaining tokens' header with `--rls-response-headers reference`.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_REMAINING_HEADER",
        value_name = "NAME",
        default_value = "RateLimit-Remaining"
    )]
    pub rls_remaining_header: String,
    /// The name of the reset's header with `--rls-response-headers reference`.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_RLS_RESET_HEADER",
        value_name = "NAME",
        default_value = "RateLimit-Reset"
    )]
    pub rls_reset_header: String,
    /// Answer every call OK, counting what is over a limit as shadow (`shadow_mode` for the
    /// whole configuration: a dry run before enforcing it).
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_SHADOW_MODE")]
    pub rls_shadow_mode: bool,
    /// Merge the files of one domain into one tree (else a domain twice is refused).
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_MERGE_DOMAINS")]
    pub rls_merge_domains: bool,
    /// Add envoyproxy/ratelimit's dynamic metadata to every answer: the domain, the
    /// descriptors, and the `metadata` of the limits they passed.
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_DYNAMIC_METADATA")]
    pub rls_dynamic_metadata: bool,
}

/// The service, and the xDS server it follows for its configuration (none: from files).
pub type Configured = (Arc<Rls>, Option<Server>);

impl RlsArgs {
    /// The service the flags configure, keying buckets under `prefix`, and the xDS server
    /// to follow for its configuration; `None` without the service.
    pub fn service(&self, prefix: &str) -> Result<Option<Configured>, String> {
        let options = Options {
            headers: self.headers()?,
            shadow: self.rls_shadow_mode,
            merge: self.rls_merge_domains,
            dynamic_metadata: self.rls_dynamic_metadata,
        };
        if let Some(path) = &self.rls_config {
            let rls = Rls::load_or_wait(path.clone(), prefix, options);
            return Ok(Some((Arc::new(rls), None)));
        }
        let Some(address) = &self.rls_xds else {
            return Ok(None);
        };
        let server = Server {
            address: address.clone(),
            node: self.rls_xds_node.clone(),
            tls: self.xds_tls(address)?,
        };
        Ok(Some((
            Arc::new(Rls::unconfigured(prefix, options)),
            Some(server),
        )))
    }

    /// The response headers, their names checked as HTTP's: a name Envoy cannot add would
    /// fail every answer there, so it stops the bridge at start instead.
    fn headers(&self) -> Result<Headers, String> {
        let named = [
            ("--rls-limit-header", &self.rls_limit_header),
            ("--rls-remaining-header", &self.rls_remaining_header),
            ("--rls-reset-header", &self.rls_reset_header),
        ];
        for (flag, name) in named {
            if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("{flag} {name:?}: not an HTTP header name"));
            }
        }
        Ok(Headers {
            kind: self.rls_response_headers,
            limit: self.rls_limit_header.clone(),
            remaining: self.rls_remaining_header.clone(),
            reset: self.rls_reset_header.clone(),
        })
    }

    fn xds_tls(
        &self,
        address: &str,
    ) -> Result<Option<(TlsConnector, ServerName<'static>)>, String> {
        let files = self.rls_xds_ca.is_some()
            || self.rls_xds_client_cert.is_some()
            || self.rls_xds_client_key.is_some();
        if !self.rls_xds_tls && !files {
            return Ok(None);
        }
        let host = match &self.rls_xds_server_name {
            Some(name) => name.clone(),
            None => address
                .rsplit_once(':')
                .map_or(address, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|e| format!("--rls-xds-server-name {host:?}: {e}"))?;
        let roots = match &self.rls_xds_ca {
            Some(path) => pem::trust_anchors(XDS_CA_FLAG, path)?.1,
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                roots
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("--rls-xds TLS: {e}"))?
            .with_root_certificates(roots);
        let identity = pem::optional_identity(
            (XDS_CERT_FLAG, self.rls_xds_client_cert.as_deref()),
            (XDS_KEY_FLAG, self.rls_xds_client_key.as_deref()),
        )?;
        let mut config = match identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain, id.key)
                .map_err(|e| format!("{XDS_CERT_FLAG}: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some((TlsConnector::from(Arc::new(config)), name)))
    }
}
