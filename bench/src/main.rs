//! `loadgen`: the bench's HTTP load generator. Fixed concurrency, fixed duration,
//! keep-alive HTTP/1.1 (or h2c, or the bridge's gRPC stream as gateway workers hold it),
//! every latency recorded, a JSON summary at the end.
//!
//! It runs on one thread so that, on the bench's 2-core machine, it takes one core at most
//! and leaves the other to the system under test.
//!
//! ```text
//! loadgen --url http://127.0.0.1:10000/api/x --concurrency 16 --duration 10 \
//!         --header 'x-user-id: u{n % 10000}' --out result.json
//! loadgen --grpc --url http://127.0.0.1:8081 --concurrency 256 --connections 16 \
//!         --body 'rl:u:u{n % 100000},1000000,1,3600,1 rl:ip:ip{n % 33000},1000000,1,3600,1'
//! ```

mod client;
mod grpc;
mod stats;
mod target;
mod template;

use clap::Parser;
use client::{Conn, Plan};
use hyper::header::HeaderName;
use hyper::Method;
use serde_json::json;
use stats::Record;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::Target;
use template::Template;

/// HTTP load generator for the ratelimit.wasm bench (loopback targets only).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Target URL, http://127.0.0.1:PORT/path; repeat it to spread the workers over
    /// several targets (worker i uses target i mod count).
    #[arg(long, required = true)]
    url: Vec<String>,
    /// Requests in flight: workers, each one request at a time.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before the measurement, whose results are discarded.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Total requests per second (open loop); default: as fast as answers come.
    #[arg(long)]
    rate: Option<f64>,
    /// HTTP method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// `name: value` header; the value is a template ({n}, {n % K}). Repeatable.
    #[arg(long)]
    header: Vec<String>,
    /// Request body template ({n}, {n % K}). With --grpc, the batch of each message: one
    /// check per line, each line rendered with its own number ({n} counts checks).
    #[arg(long)]
    body: Option<String>,
    /// Speak h2c: --connections per target, every worker a stream on one of them.
    #[arg(long)]
    h2: bool,
    /// Be a fleet of gateway workers to the bridge: every worker a long-lived gRPC stream
    /// (`POST /ratelimit.v1.Bridge/Check`, h2c, over --connections per target) sending one
    /// message at a time and waiting for its reply; --url names the bridge (its path is
    /// ignored). A reply line `!` or `?` counts as an error.
    #[arg(long, conflicts_with = "h2")]
    grpc: bool,
    /// h2c connections per target with --h2 or --grpc; workers are spread over them.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Write the JSON summary here instead of stdout.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let plan = plan(&args)?;
    let targets = plan.targets.len();
    // Connection c of target t is shared[c * targets + t]: worker i uses target i mod
    // targets and, of its connections, number (i / targets) mod --connections.
    let (mut h2, mut streams) = (Vec::new(), Vec::new());
    for _ in 0..plan.connections {
        for target in &plan.targets {
            if plan.grpc {
                streams.push(grpc::connect(target).await?);
            } else if plan.h2 {
                if let Conn::H2(sender) = client::connect(target, true).await? {
                    h2.push(sender);
                }
            }
        }
    }
    let stream_headers: Vec<_> = plan
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), value.render(0)))
        .collect();
    let mut workers = Vec::with_capacity(plan.concurrency);
    for i in 0..plan.concurrency {
        let target = &plan.targets[i % targets];
        let shared = i % targets + (i / targets) % plan.connections * targets;
        let conn = if plan.grpc {
            let stream =
                grpc::Stream::open(streams[shared].clone(), target, stream_headers.clone());
            Conn::Grpc(Box::new(stream.await?))
        } else if plan.h2 {
            Conn::H2(h2[shared].clone())
        } else {
            client::connect(target, false).await?
        };
        workers.push(tokio::spawn(client::worker(plan.clone(), i, conn)));
    }
    let mut record = Record::default();
    for w in workers {
        record.merge(w.await.map_err(|e| format!("worker failed: {e}"))?);
    }
    let elapsed = plan.measure_from.elapsed();
    let settings = json!({
        "urls": args.url,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rate": args.rate,
        "method": args.method,
        "headers": args.header,
        "body": args.body,
        "h2": args.h2,
        "grpc": args.grpc,
        "connections": args.connections,
    });
    let text = record.summary(elapsed, settings, plan.grpc).to_string();
    match &args.out {
        Some(path) => {
            std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
        }
        None => {
            println!("{text}");
            Ok(())
        }
    }
}

/// Validates the arguments into the workers' shared plan.
fn plan(args: &Args) -> Result<Arc<Plan>, String> {
    let targets = args
        .url
        .iter()
        .map(|u| Target::parse(u))
        .collect::<Result<Vec<_>, _>>()?;
    if args.concurrency == 0 || args.connections == 0 {
        return Err("--concurrency and --connections must be at least 1".into());
    }
    if !(args.duration > 0.0 && args.warmup >= 0.0) {
        return Err("--duration must be > 0 and --warmup >= 0".into());
    }
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err("--rate must be > 0".into());
    }
    let method = Method::from_bytes(args.method.as_bytes())
        .map_err(|e| format!("--method {}: {e}", args.method))?;
    let mut headers = Vec::new();
    for h in &args.header {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| format!("--header {h:?}: expected 'name: value'"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|e| format!("--header {h:?}: {e}"))?;
        headers.push((name, Template::parse(value.trim())?));
    }
    let body = args.body.as_deref().map(Template::parse).transpose()?;
    let checks = match (args.grpc, args.body.as_deref()) {
        (false, _) => Vec::new(),
        (true, None) => return Err("--grpc needs a --body: the checks of each message".into()),
        (true, Some(batch)) => batch
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(Template::parse)
            .collect::<Result<Vec<_>, _>>()?,
    };
    if args.grpc && checks.is_empty() {
        return Err("--grpc: the --body has no check".into());
    }
    let measure_from = Instant::now() + Duration::from_secs_f64(args.warmup);
    Ok(Arc::new(Plan {
        targets,
        method,
        headers,
        body,
        checks,
        concurrency: args.concurrency,
        h2: args.h2,
        grpc: args.grpc,
        connections: args.connections,
        rate: args.rate,
        measure_from,
        until: measure_from + Duration::from_secs_f64(args.duration),
        counter: AtomicU64::new(0),
    }))
}
