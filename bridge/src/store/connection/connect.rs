//! How the bridge reaches Redis beyond what `--redis` says: TLS trust and client certificate,
//! and a username and password that need not sit in the URL (a URL is visible in the process
//! list and in the environment). The same settings go to a single server and to every node of
//! a cluster, including the nodes the cluster client discovers, which redis-rs dials with the
//! seeds' credentials and TLS parameters; and to the master that Redis Sentinels name, whose
//! address comes from them while everything else comes from the flags (the sentinels
//! themselves have credentials of their own, or none). Also: the URL as it may be logged.

use super::redis_tls::{self, TlsFiles};
use redis::cluster::ClusterClientBuilder;
use redis::{
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, TlsCertificates,
};
use std::path::{Path, PathBuf};

const USER_FLAG: &str = "--redis-username";
const PASSWORD_FLAG: &str = "--redis-password-file";
const SENTINEL_USER_FLAG: &str = "--sentinel-username";
const SENTINEL_PASSWORD_FLAG: &str = "--sentinel-password-file";

/// What to add to the `--redis` URLs when connecting.
#[derive(Debug, Clone, Default)]
pub struct RedisAccess {
    /// CA and client certificate for `rediss://`.
    pub tls: TlsFiles,
    /// ACL user, instead of `user@` in the URL.
    pub username: Option<String>,
    /// File holding the password (whitespace around it ignored), instead of `:pass@`.
    pub password_file: Option<PathBuf>,
}

/// How to log in to the sentinels themselves (`--sentinel-username`,
/// `--sentinel-password-file`): a sentinel often has a password of its own, or none, so the
/// `--redis` credentials, which are the master's, are never sent to it.
#[derive(Debug, Clone, Default)]
pub struct SentinelLogin {
    /// ACL user on the sentinels.
    pub username: Option<String>,
    /// File holding the sentinels' password (whitespace around it ignored).
    pub password_file: Option<PathBuf>,
}

/// What `--sentinel` connects with: each sentinel, and how to reach the master they name.
pub struct SentinelClients {
    /// Each sentinel's `host:port` (for logs and errors) and its client.
    pub sentinels: Vec<(String, redis::Client)>,
    /// How to reach a master at the address the sentinels give.
    pub master: NodeAccess,
}

/// How to reach a node whose address only the sentinels know: TLS when the sentinels' URLs
/// are `rediss://` (with the `--redis-ca-file` trust and client certificate), and the
/// credentials and database of the `--redis` URLs and flags.
#[derive(Clone)]
pub struct NodeAccess {
    /// Database, credentials and protocol of the `--redis` URLs with the flags applied.
    settings: RedisConnectionInfo,
    /// `None`: plaintext; `Some(None)`: TLS trusting the system's roots; `Some(Some(_))`:
    /// TLS with the CA and client certificate of the flags.
    tls: Option<Option<TlsCertificates>>,
}

impl NodeAccess {
    /// A client for the node at `host:port`. A TLS certificate must name `host` as the
    /// sentinels give it (an IP, unless they announce hostnames).
    pub fn client(&self, host: &str, port: u16) -> Result<redis::Client, String> {
        let addr = match self.tls {
            None => ConnectionAddr::Tcp(host.into(), port),
            Some(_) => ConnectionAddr::TcpTls {
                host: host.into(),
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| format!("{host}:{port}: {e}"))?
            .set_redis_settings(self.settings.clone());
        match &self.tls {
            Some(Some(certificates)) => redis::Client::build_with_tls(info, certificates.clone()),
            _ => redis::Client::open(info),
        }
        .map_err(|e| format!("{host}:{port}: {e}"))
    }
}

impl RedisAccess {
    /// The sentinels at `urls` (`--sentinel`), logged in to with `login`, and how to reach
    /// the master they name. The URLs' own credentials and database are the master's, so
    /// every URL must carry the same (or none); the master is reached over TLS exactly when
    /// the sentinels are.
    pub fn sentinel(
        &self,
        urls: &[String],
        login: &SentinelLogin,
    ) -> Result<SentinelClients, String> {
        let infos = urls
            .iter()
            .map(|url| parse(url))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = infos.first() else {
            return Err("--redis: no sentinel address".into());
        };
        let same = |a: &RedisConnectionInfo, b: &RedisConnectionInfo| {
            (a.username(), a.password(), a.db()) == (b.username(), b.password(), b.db())
        };
        if infos
            .iter()
            .any(|info| !same(info.redis_settings(), first.redis_settings()))
        {
            return Err(
                "--redis: with --sentinel, every URL must carry the same user, \
                        password and database (the master's), or none"
                    .into(),
            );
        }
        let master = self
            .authenticated(first.clone(), self.password()?.as_deref())?
            .redis_settings()
            .clone();
        let certificates = self.certificates(&infos)?;
        let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
        let login_password = login
            .password_file
            .as_deref()
            .map(|path| read_password(SENTINEL_PASSWORD_FLAG, path))
            .transpose()?;
        let mut sentinel = RedisConnectionInfo::default();
        if let Some(username) = &login.username {
            if login_password.is_none() {
                return Err(format!(
                    "{SENTINEL_USER_FLAG} needs {SENTINEL_PASSWORD_FLAG}"
                ));
            }
            sentinel = sentinel.set_username(username);
        }
        if let Some(password) = &login_password {
            sentinel = sentinel.set_password(password);
        }
        let sentinels = infos
            .into_iter()
            .map(|info| {
                let name = info.addr().to_string();
                let info = info.set_redis_settings(sentinel.clone());
                match &certificates {
                    Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
                    None => redis::Client::open(info),
                }
                .map(|client| (name.clone(), client))
                .map_err(|e| format!("--redis {name}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SentinelClients {
            sentinels,
            master: NodeAccess {
                settings: master,
                tls: tls.then_some(certificates),
            },
        })
    }

    /// A client for the one server at `url`.
    pub fn single(&self, url: &str) -> Result<redis::Client, String> {
        let info = self.authenticated(parse(url)?, self.password()?.as_deref())?;
        match self.certificates(std::slice::from_ref(&info))? {
            Some(certificates) => redis::Client::build_with_tls(info, certificates),
            None => redis::Client::open(info),
        }
        .map_err(|e| format!("--redis: {e}"))
    }

    /// A cluster client, still to be tuned and built, reaching the cluster through `seeds`.
    pub fn cluster(&self, seeds: &[String]) -> Result<ClusterClientBuilder, String> {
        let password = self.password()?;
        let seeds = seeds
            .iter()
            .map(|url| self.authenticated(parse(url)?, password.as_deref()))
            .collect::<Result<Vec<_>, _>>()?;
        let builder = match self.certificates(&seeds)? {
            Some(certificates) => ClusterClientBuilder::new(seeds).certs(certificates),
            None => ClusterClientBuilder::new(seeds),
        };
        Ok(builder)
    }

    /// `info` with the username of the flag and `password` (from the flag's file). A URL that
    /// has its own as well is refused rather than silently overridden: one of the two is a
    /// mistake.
    fn authenticated(
        &self,
        info: ConnectionInfo,
        password: Option<&str>,
    ) -> Result<ConnectionInfo, String> {
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &self.username {
            if settings.username().is_some() {
                return Err(format!("{USER_FLAG}: the --redis URL names a user too"));
            }
            settings = settings.set_username(username);
        }
        if let Some(password) = password {
            if settings.password().is_some() {
                return Err(format!(
                    "{PASSWORD_FLAG}: the --redis URL has a password too"
                ));
            }
            settings = settings.set_password(password);
        }
        // redis-rs authenticates only with a password, and would not say so.
        if settings.username().is_some() && settings.password().is_none() {
            return Err(format!(
                "{USER_FLAG} (or user@ in --redis) needs a password: \
                 {PASSWORD_FLAG} or user:password@ in the URL"
            ));
        }
        Ok(info.set_redis_settings(settings))
    }

    fn password(&self) -> Result<Option<String>, String> {
        self.password_file
            .as_deref()
            .map(|path| read_password(PASSWORD_FLAG, path))
            .transpose()
    }

    /// The TLS certificates for `seeds`, which must all be `rediss://` if there are any: a
    /// CA file given for a plaintext URL means the URL is wrong, not that TLS is optional.
    fn certificates(&self, seeds: &[ConnectionInfo]) -> Result<Option<TlsCertificates>, String> {
        let tls = seeds
            .iter()
            .filter(|info| matches!(info.addr(), ConnectionAddr::TcpTls { .. }))
            .count();
        if tls == 0 && self.tls.is_empty() {
            return Ok(None);
        }
        if tls < seeds.len() {
            return Err(if tls == 0 {
                "--redis-ca-file, --redis-client-cert and --redis-client-key need a rediss:// URL \
                 in --redis"
            } else {
                "--redis: some URLs are rediss:// and some are not"
            }
            .into());
        }
        redis_tls::use_ring();
        self.tls.load()
    }
}

/// The password in the file at `path`, given with `flag`: its content, whitespace around it
/// trimmed.
fn read_password(flag: &str, path: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let password = text.trim();
    if password.is_empty() {
        return Err(format!("{flag} {}: the file is empty", path.display()));
    }
    Ok(password.to_string())
}

fn parse(url: &str) -> Result<ConnectionInfo, String> {
    url.into_connection_info()
        .map_err(|e| format!("--redis {}: {e}", redact(url)))
}

/// `urls` (comma-separated) with every password replaced by `***`, fit for a log line or an
/// error message. The last `@` ends the user part, so a password with a raw `@` or `/` is
/// hidden whole.
pub fn redact(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let Some((scheme, rest)) = url.split_once("://") else {
                return url.to_string();
            };
            let Some((userinfo, host)) = rest.rsplit_once('@') else {
                return url.to_string();
            };
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => url.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
