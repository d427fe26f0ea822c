//! Command line and process lifecycle of `ratelimit-bridge`.

use clap::Parser;
use ratelimit_bridge::access::Access;
use ratelimit_bridge::connect::{redact, RedisAccess};
use ratelimit_bridge::keyspace::{Keyspace, DEFAULT_PREFIX};
use ratelimit_bridge::limits::Limits;
use ratelimit_bridge::redis_tls::TlsFiles;
use ratelimit_bridge::server::{self, Config};
use ratelimit_bridge::store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// Runs ratelimit.wasm's token-bucket checks on Redis or Valkey.
///
/// Serves `POST /v1/check` (the filter's callout, HTTP/1.1 or h2c) and `GET /healthz`
/// (200 when Redis answers, 503 when not). Stops gracefully on SIGTERM or SIGINT.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    listen: SocketAddr,
    /// Redis or Valkey URL: redis://[[user]:password@]host:port[/db], or rediss://... for TLS
    /// (rustls; the system's CA roots unless --redis-ca-file). With --cluster:
    /// comma-separated seed nodes of the cluster (any reachable one suffices). Passwords are
    /// masked in logs; --redis-password-file keeps them out of the process list too.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REDIS",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    redis: String,
    /// Treat --redis as a Redis Cluster: slot routing, MOVED/ASK, topology refresh.
    #[arg(long, env = "RATELIMIT_BRIDGE_CLUSTER")]
    cluster: bool,
    /// PEM bundle of the CAs that sign Redis's certificate, trusted instead of the system's
    /// roots (rediss:// only).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CA_FILE", value_name = "PATH")]
    redis_ca_file: Option<PathBuf>,
    /// PEM certificate (chain) the bridge presents to Redis for mutual TLS (rediss:// only;
    /// needs --redis-client-key).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CLIENT_CERT", value_name = "PATH")]
    redis_client_cert: Option<PathBuf>,
    /// PEM private key of --redis-client-cert.
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_CLIENT_KEY", value_name = "PATH")]
    redis_client_key: Option<PathBuf>,
    /// ACL user to authenticate as, instead of user@ in --redis (needs a password).
    #[arg(long, env = "RATELIMIT_BRIDGE_REDIS_USERNAME", value_name = "USER")]
    redis_username: Option<String>,
    /// File holding the Redis password (surrounding whitespace ignored), instead of
    /// :password@ in --redis. With no username: the default user (requirepass).
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REDIS_PASSWORD_FILE",
        value_name = "PATH"
    )]
    redis_password_file: Option<PathBuf>,
    /// Bound on connecting to Redis, in milliseconds.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_CONNECT_TIMEOUT_MS",
        default_value_t = 250
    )]
    connect_timeout_ms: u64,
    /// Bound on one Redis command, in milliseconds.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_REDIS_TIMEOUT_MS",
        default_value_t = 1000
    )]
    redis_timeout_ms: u64,
    /// Comma-separated key prefixes: the bridge touches only keys `PREFIX:...` and refuses
    /// any check naming another key (the filter's `key_prefix` must be one of them).
    #[arg(long, env = "RATELIMIT_BRIDGE_KEY_PREFIX", default_value = DEFAULT_PREFIX)]
    key_prefix: String,
    /// Worker threads (0: one per core).
    #[arg(long, env = "RATELIMIT_BRIDGE_THREADS", default_value_t = 0)]
    threads: usize,
    /// A connection with no request in progress is closed unless its next request's
    /// headers are complete within this, in milliseconds (slowloris). An open gRPC stream
    /// is a request in progress, however long it idles.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_HEADER_TIMEOUT_MS",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    header_timeout_ms: u64,
    /// A request body (`POST /v1/check`: 408 past it), or a message on the gRPC stream (the
    /// stream ends with DEADLINE_EXCEEDED), must arrive whole within this once begun, in
    /// milliseconds.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_BODY_TIMEOUT_MS",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    body_timeout_ms: u64,
    /// Connections served at once; past it new connections are closed at once.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_connections: u32,
    /// File holding the token gateways must present (`authorization: Bearer <token>`) to
    /// check; surrounding whitespace is trimmed. Without it any caller may check.
    #[arg(long, env = "RATELIMIT_BRIDGE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        runtime.worker_threads(args.threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let access = match &args.token_file {
        Some(path) => Access::from_token_file(path)?,
        None => {
            log::warn!(
                "no --token-file: any caller that reaches the bridge may check, and consume, \
                 any bucket"
            );
            Access::open()
        }
    };
    let options = StoreOptions {
        connect_timeout: Duration::from_millis(args.connect_timeout_ms),
        response_timeout: Duration::from_millis(args.redis_timeout_ms),
    };
    let redis_access = RedisAccess {
        tls: TlsFiles {
            ca_file: args.redis_ca_file,
            client_cert: args.redis_client_cert,
            client_key: args.redis_client_key,
        },
        username: args.redis_username,
        password_file: args.redis_password_file,
    };
    let redis = redact(&args.redis);
    let store = if args.cluster {
        let seeds: Vec<String> = args
            .redis
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        Store::with_cluster(redis_access.cluster(&seeds)?, options)
    } else if args.redis.contains(',') {
        return Err("--redis: several URLs need --cluster".into());
    } else {
        Store::with_client(redis_access.single(&args.redis)?, options)
    }
    .map_err(|e| format!("--redis {redis}: {e}"))?
    .with_keyspace(Keyspace::parse(&args.key_prefix).map_err(|e| format!("--key-prefix: {e}"))?);
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let mode = if args.cluster { "cluster" } else { "single" };
    log::info!("listening on {} (redis {mode} {redis})", args.listen);
    let limits = Limits {
        header_timeout: Duration::from_millis(args.header_timeout_ms),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        max_connections: args.max_connections,
    };
    server::run(listener, store, Config { limits, access }, shutdown).await;
    Ok(())
}
