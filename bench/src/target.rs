//! Where the load goes, and the TCP connection every protocol starts from: loopback
//! targets only, by house rule.

use hyper::Uri;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// `host:port`, for the Host header and the h2 `:authority`.
    pub authority: String,
    pub path: String,
}

impl Target {
    /// Parses `http://127.0.0.1:PORT/path`; any other host is refused.
    pub fn parse(url: &str) -> Result<Target, String> {
        let uri: Uri = url.parse().map_err(|e| format!("--url {url}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("--url {url}: only http:// is supported"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--url {url}: no host"))?;
        if authority.host() != "127.0.0.1" {
            return Err(format!("--url {url}: only 127.0.0.1 may be targeted"));
        }
        let port = authority
            .port_u16()
            .ok_or_else(|| format!("--url {url}: no port"))?;
        Ok(Target {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            authority: authority.to_string(),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
        })
    }
}

/// A TCP connection to `target`, Nagle off.
pub async fn dial(target: &Target) -> Result<TokioIo<TcpStream>, String> {
    let stream = TcpStream::connect(target.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", target.addr))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("nodelay: {e}"))?;
    Ok(TokioIo::new(stream))
}
