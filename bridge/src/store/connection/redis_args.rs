//! Where Redis is and how to reach it (`RedisArgs`): the flags shared by the server, every
//! command and every region of `--region-redis`, and the store they name.

use super::connect::{redact, RedisAccess, SentinelLogin};
use super::redis_tls::TlsFiles;
use super::sentinel::Sentinels;
use crate::store::{Store, StoreOptions};
use clap::Args;
use std::path::PathBuf;

/// Where Redis is and how to reach it: shared by the server and every command.
#[derive(Args, Debug, Clone)]
pub struct RedisArgs {
    /// Redis or Valkey URL: redis://[[user]:password@]host:port[/db], or rediss://... for TLS
    /// (rustls; the system's CA roots unless --redis-ca-file). With --cluster:
    /// comma-separated seed nodes of the cluster (any reachable one suffices). With
    /// --sentinel: comma-separated sentinels (redis://host:26379,...; rediss:// makes the
    /// sentinels and the master TLS), whose user:password@, if any, is the master's.
    /// Passwords are masked in logs; --redis-password-file keeps them out of the process
    /// list too.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REDIS",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis: String,
    /// Treat --redis as a Redis Cluster: slot routing, MOVED/ASK, topology refresh.
    #[arg(long, env = "RATELIMIT_BRIDGE_CLUSTER")]
    pub cluster: bool,
    /// Treat --redis as Redis Sentinels and use the master they monitor under MASTER_NAME,
    /// following it through failovers (not with --cluster).
    #[arg(long, env = "RATELIMIT_BRIDGE_SENTINEL", value_name = "MASTER_NAME")]
    pub sentinel: Option<String>,
    /// ACL user on the sentinels (needs --sentinel-password-file). The --redis-* credentials
    /// are the master's and never go to a sentinel.
    #[arg(long, env = "RATELIMIT_BRIDGE_SENTINEL_USERNAME", value_name = "USER")]
    pub sentinel_username: Option<String>,
    /// File holding the sentinels' password (surrounding whitespace ignored), for sentinels
    /// with `requirepass` or an ACL user of their own.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_SENTINEL_PASSWORD_FILE",
        value_name = "PATH"
    )]
    pub sentinel_password_file: Option<PathBuf>,
    /// PEM bundle of the CAs that sign Redis's certificate, trusted instead of the system's
    /// roots (rediss:// only).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CA_FILE", value_name = "PATH")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM certificate (chain) the bridge presents to Redis for mutual TLS (rediss:// only;
    /// needs --redis-client-key).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CLIENT_CERT", value_name = "PATH")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key of --redis-client-cert.
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CLIENT_KEY", value_name = "PATH")]
    pub redis_client_key: Option<PathBuf>,
    /// ACL user to authenticate as, instead of user@ in --redis (needs a password).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_USERNAME", value_name = "USER")]
    pub redis_username: Option<String>,
    /// File holding the Redis password (surrounding whitespace ignored), instead of
    /// :password@ in --redis. With no username: the default user (requirepass).
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REDIS_PASSWORD_FILE",
        value_name = "PATH"
    )]
    pub redis_password_file: Option<PathBuf>,
}

impl RedisArgs {
    /// The store these flags name (not connected yet: the first command connects).
    pub fn store(&self, options: StoreOptions) -> Result<Store, String> {
        let access = RedisAccess {
            tls: TlsFiles {
                ca_file: self.redis_ca_file.clone(),
                client_cert: self.redis_client_cert.clone(),
                client_key: self.redis_client_key.clone(),
            },
            username: self.redis_username.clone(),
            password_file: self.redis_password_file.clone(),
        };
        let login = SentinelLogin {
            username: self.sentinel_username.clone(),
            password_file: self.sentinel_password_file.clone(),
        };
        let urls = || -> Vec<String> {
            self.redis
                .split(',')
                .map(|s| s.trim().to_string())
                .collect()
        };
        if let Some(name) = &self.sentinel {
            if self.cluster {
                return Err(
                    "--cluster and --sentinel exclude each other: a Redis Cluster fails \
                            over by itself, Sentinel watches a master and its replicas"
                        .into(),
                );
            }
            let clients = access.sentinel(&urls(), &login)?;
            let sentinels = Sentinels::new(
                name,
                clients,
                options.connect_timeout,
                options.response_timeout,
            )?;
            return Ok(Store::with_sentinel(sentinels, options));
        }
        if login.username.is_some() || login.password_file.is_some() {
            return Err("--sentinel-username and --sentinel-password-file need --sentinel".into());
        }
        if self.cluster {
            Store::with_cluster(access.cluster(&urls())?, options)
        } else if self.redis.contains(',') {
            return Err("--redis: several URLs need --cluster or --sentinel".into());
        } else {
            Store::with_client(access.single(&self.redis)?, options)
        }
        .map_err(|e| format!("--redis {}: {e}", redact(&self.redis)))
    }
}
