//! Command line and process lifecycle of `ratelimit-bridge`.

use clap::Parser;
use ratelimit_bridge::doors::commands::{self, Command, RedisArgs};
use ratelimit_bridge::doors::guards::access::Access;
use ratelimit_bridge::doors::guards::deadlines::ConnectionBounds;
use ratelimit_bridge::doors::guards::listen_tls::ListenTlsArgs;
use ratelimit_bridge::doors::probes;
use ratelimit_bridge::doors::rls::args::RlsArgs;
use ratelimit_bridge::doors::rls::{compat, xds};
use ratelimit_bridge::doors::server::{self, Config};
use ratelimit_bridge::doors::usage;
use ratelimit_bridge::engine::regions::flags::RegionArgs;
use ratelimit_bridge::engine::Engine;
use ratelimit_bridge::store::connection::connect::redact;
use ratelimit_bridge::store::keyspace::{Keyspace, DEFAULT_PREFIX};
use ratelimit_bridge::store::StoreOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs ratelimit.wasm's token-bucket checks on Redis or Valkey.
///
/// Serves `POST /v1/check` (the filter's callout, HTTP/1.1 or h2c), the gRPC stream,
/// `GET /healthz` (200 when Redis answers, 503 when not), `GET /metrics` (Prometheus text)
/// and, with --admin-token-file, the admin endpoints under /admin/. Stops gracefully on SIGTERM
/// or SIGINT. With a command (`override`, `unblock`, `usage`), runs it and exits instead.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Args,
}

/// The server's flags.
#[derive(clap::Args, Debug)]
struct Args {
    /// Address to listen on.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    listen: SocketAddr,
    #[command(flatten)]
    tls: ListenTlsArgs,
    /// More addresses (comma-separated) serving only GET /healthz (/healthcheck) and
    /// /metrics, in plaintext HTTP/1.1: for probes and scrapes that cannot use --listen's
    /// TLS or token.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_PROBE_LISTEN",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    probe_listen: Vec<SocketAddr>,
    #[command(flatten)]
    redis: RedisArgs,
    #[command(flatten)]
    regions: RegionArgs,
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
    #[command(flatten)]
    rls: RlsArgs,
    /// The plugin configuration (JSON) the gateways load, for `GET /admin/usage`.
    #[arg(long, env = "RATELIMIT_BRIDGE_CONFIG", value_name = "PLUGIN.json")]
    config: Option<PathBuf>,
    /// Script calls in flight per Redis node (and mode) at once. Checks that arrive while
    /// they are out join the next call, so fewer calls in flight make larger calls, and
    /// Redis pays a call's fixed cost less often; more hide a long round trip to Redis.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_CALLS_IN_FLIGHT",
        default_value_t = ratelimit_bridge::store::calls::commit::CALLS_IN_FLIGHT as u64,
        value_parser = clap::value_parser!(u64).range(1..=64)
    )]
    calls_in_flight: u64,
    /// Worker threads (0: one per core). 1 runs a single-threaded scheduler, which costs
    /// the least CPU per check: run one bridge per core and spread the gateways over them.
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
    /// A reply on a gRPC stream that its connection could not take to write within this, in
    /// milliseconds, because the peer grants no HTTP/2 window or does not read, closes the
    /// connection at once.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_WRITE_TIMEOUT_MS",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u64).range(2..)
    )]
    write_timeout_ms: u64,
    /// The memory every exchange in the bridge may hold at once, from read to answered, in
    /// MiB (about four times its bytes on the wire); past it the bridge stops reading until
    /// answers go out.
    #[arg(
        long,
        env = "RATELIMIT_BRIDGE_MAX_PENDING_MIB",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_pending_mib: u32,
    /// Connections served at once; past it a new connection takes the slot of the oldest
    /// one that has not checked anything, or is closed at once if every one has.
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
    /// File holding the operators' token, which /admin/ demands (`authorization: Bearer
    /// <token>`); the same rules as --token-file, and not the same token. Without it
    /// /admin/ is not served.
    #[arg(long, env = "RATELIMIT_BRIDGE_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match compat::apply() {
        Ok(set) if !set.is_empty() => {
            log::info!(
                "envoyproxy/ratelimit's environment read as {}",
                set.join(", ")
            );
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("ratelimit-bridge: envoyproxy/ratelimit's environment: {e}");
            return ExitCode::from(2);
        }
    }
    let cli = Cli::parse();
    if let Some(command) = cli.command {
        return run_command(command);
    }
    let args = cli.serve;
    // One thread: tokio's single-threaded scheduler. Woken tasks run in the order they were
    // woken, so the answers a script call sets free are all written before a connection
    // flushes, in one write per connection; the multi-threaded scheduler runs the last woken
    // task next (its LIFO slot), which flushed each answer in a write of its own: a fifth
    // of the bridge's CPU per check went to those syscalls (perf).
    let mut runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if args.threads > 1 {
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
    let admin = match &args.admin_token_file {
        Some(path) => Access::from_admin_token_file(path, &access)?,
        None => Access::open(),
    };
    let options = StoreOptions {
        connect_timeout: Duration::from_millis(args.connect_timeout_ms),
        response_timeout: Duration::from_millis(args.redis_timeout_ms),
    };
    let plugin = match &args.config {
        Some(path) => Some(Arc::new(
            usage::load_plugin(path).map_err(|e| format!("--config {e}"))?,
        )),
        None => None,
    };
    let redis = redact(&args.redis.redis);
    let store = args
        .redis
        .store(options)?
        .with_calls_in_flight(args.calls_in_flight as usize)
        .with_keyspace(
            Keyspace::parse(&args.key_prefix).map_err(|e| format!("--key-prefix: {e}"))?,
        );
    if let Some(plugin) = &plugin {
        if !store.keyspace().prefixes().any(|p| p == plugin.key_prefix) {
            return Err(format!(
                "--config: its key_prefix {:?} is not one of --key-prefix {:?}",
                plugin.key_prefix, args.key_prefix
            ));
        }
    }
    let regions = args.regions.regions(&args.redis, options)?.map(Arc::new);
    let prefix = store.keyspace().prefixes().next().unwrap_or(DEFAULT_PREFIX);
    // The rate limit service's configuration is parsed on a blocking thread, never on the
    // runtime, at start as on every reload: its cost is the operator's file's to set.
    let (rls_args, rls_prefix) = (args.rls.clone(), prefix.to_owned());
    let configured = tokio::task::spawn_blocking(move || rls_args.service(&rls_prefix))
        .await
        .map_err(|e| format!("--rls-config: {e}"))?;
    let (rls, xds) = match configured? {
        Some((rls, xds)) => (Some(rls), xds),
        None => (None, None),
    };
    let reloading = rls.clone().map(|rls| tokio::spawn(rls.watch()));
    let following = rls
        .clone()
        .zip(xds)
        .map(|(rls, xds)| tokio::spawn(xds::follow(rls, xds)));
    let tls = args.tls.acceptor()?;
    let engine = Engine::new(store, regions.clone());
    let mut probing = Vec::new();
    for addr in &args.probe_listen {
        let probes = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("--probe-listen {addr}: {e}"))?;
        probing.push(tokio::spawn(probes::serve(
            probes,
            engine.clone(),
            rls.clone(),
        )));
    }
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
    let mode = match (&args.redis.sentinel, args.redis.cluster) {
        (Some(name), _) => format!("sentinel {name:?}"),
        (None, true) => "cluster".into(),
        (None, false) => "single".into(),
    };
    match &regions {
        Some(r) => log::info!(
            "listening on {} (redis {mode} {redis}, region {})",
            args.listen,
            r.own()
        ),
        None => log::info!("listening on {} (redis {mode} {redis})", args.listen),
    }
    let (stop_leasing, stopped) = tokio::sync::watch::channel(false);
    let leasing = regions.clone().map(|r| tokio::spawn(r.run(stopped)));
    let bounds = ConnectionBounds {
        header_timeout: Duration::from_millis(args.header_timeout_ms),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        write_timeout: Duration::from_millis(args.write_timeout_ms),
        max_connections: args.max_connections,
        max_pending_mib: args.max_pending_mib,
    };
    server::run(
        listener,
        engine,
        Config {
            bounds,
            access,
            admin,
            plugin,
            rls,
            tls,
        },
        shutdown,
    )
    .await;
    for task in reloading.into_iter().chain(following).chain(probing) {
        task.abort();
    }
    // Leases not spent go back to their ledgers.
    let _ = stop_leasing.send(true);
    if let Some(leasing) = leasing {
        let _ = leasing.await;
    }
    Ok(())
}

/// Runs an operator's command and prints its JSON; a failure is one line on stderr.
fn run_command(command: Command) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(command)) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ratelimit-bridge: {e}");
            ExitCode::FAILURE
        }
    }
}
