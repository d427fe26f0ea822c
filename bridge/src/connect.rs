//! How the bridge reaches Redis beyond what `--redis` says: TLS trust and client certificate,
//! and a username and password that need not sit in the URL (a URL is visible in the process
//! list and in the environment). The same settings go to a single server and to every node of
//! a cluster, including the nodes the cluster client discovers, which redis-rs dials with the
//! seeds' credentials and TLS parameters. Also: the URL as it may be logged.

use crate::redis_tls::{self, TlsFiles};
use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsCertificates};
use std::path::PathBuf;

const USER_FLAG: &str = "--redis-username";
const PASSWORD_FLAG: &str = "--redis-password-file";

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

impl RedisAccess {
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
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{PASSWORD_FLAG} {}: {e}", path.display()))?;
        let password = text.trim();
        if password.is_empty() {
            return Err(format!(
                "{PASSWORD_FLAG} {}: the file is empty",
                path.display()
            ));
        }
        Ok(Some(password.to_string()))
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        for (url, logged) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://alice@h:1/0", "redis://alice@h:1/0"),
            ("rediss://alice:s3cr%40t@h:1", "rediss://alice:***@h:1"),
            ("redis://:pw@h:1", "redis://:***@h:1"),
            ("redis://u:p@ss/w@rd@h:1/2", "redis://u:***@h:1/2"),
            (
                "redis://a:x@h1:1,redis://h2:2,redis://a:y@h3:3",
                "redis://a:***@h1:1,redis://h2:2,redis://a:***@h3:3",
            ),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), logged, "{url}");
        }
    }

    fn password_file(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("ratelimit-connect-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn flags_set_the_credentials() {
        let path = password_file("flags", "  s3cret\n");
        let access = RedisAccess {
            username: Some("alice".into()),
            password_file: Some(path.clone()),
            ..RedisAccess::default()
        };
        let password = access.password();
        std::fs::remove_file(path).unwrap();
        let password = password.unwrap();
        assert_eq!(password.as_deref(), Some("s3cret"), "trimmed");
        let info = access
            .authenticated(parse("redis://h:1").unwrap(), password.as_deref())
            .unwrap();
        assert_eq!(info.redis_settings().username(), Some("alice"));
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
    }

    #[test]
    fn conflicting_or_incomplete_credentials_are_refused_naming_the_flag() {
        let empty = password_file("empty", " \n");
        let given = password_file("given", "pw");
        let cases = [
            (
                Some("bob"),
                None,
                "redis://alice:pw@h:1",
                "--redis-username",
            ),
            (
                None,
                Some(given.clone()),
                "redis://:pw@h:1",
                "--redis-password-file",
            ),
            (Some("bob"), None, "redis://h:1", "needs a password"),
            (None, None, "redis://alice@h:1", "needs a password"),
            (None, Some(empty.clone()), "redis://h:1", "is empty"),
            (
                None,
                Some("/nonexistent/pw".into()),
                "redis://h:1",
                "/nonexistent/pw",
            ),
        ];
        for (username, password_file, url, expected) in cases {
            let access = RedisAccess {
                username: username.map(String::from),
                password_file,
                ..RedisAccess::default()
            };
            let err = access.single(url).err().unwrap();
            assert!(err.contains(expected), "{url}: {err}");
            assert!(!err.contains(":pw@"), "{err}");
        }
        std::fs::remove_file(empty).unwrap();
        std::fs::remove_file(given).unwrap();
    }

    #[test]
    fn tls_files_need_rediss_urls() {
        let access = RedisAccess {
            tls: TlsFiles {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..TlsFiles::default()
            },
            ..RedisAccess::default()
        };
        let err = access.single("redis://h:1").err().unwrap();
        assert!(err.contains("need a rediss:// URL"), "{err}");
        let seeds = ["rediss://h:1".to_string(), "redis://h:2".to_string()];
        let err = access.cluster(&seeds).err().unwrap();
        assert!(err.contains("some URLs are rediss://"), "{err}");
        let err = access.single("rediss://h:1").err().unwrap();
        assert!(
            err.contains("--redis-ca-file /nonexistent/ca.pem: "),
            "{err}"
        );
    }
}
