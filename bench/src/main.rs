//! `loadgen`: the bench's HTTP load generator. Fixed concurrency, fixed duration,
//! keep-alive HTTP/1.1 (or h2c), every latency recorded, a JSON summary at the end.
//!
//! It runs on one thread so that, on the bench's 2-core machine, it takes one core at most
//! and leaves the other to the system under test.
//!
//! ```text
//! loadgen --url http://127.0.0.1:10000/api/x --concurrency 16 --duration 10 \
//!         --header 'x-user-id: u{n % 10000}' --out result.json
//! ```

mod client;
mod stats;
mod template;

use clap::Parser;
use client::{Conn, Plan, Target};
use hyper::header::HeaderName;
use hyper::Method;
use serde_json::json;
use stats::Record;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// Request body template ({n}, {n % K}).
    #[arg(long)]
    body: Option<String>,
    /// Speak h2c: one connection per target, every worker a stream on it.
    #[arg(long)]
    h2: bool,
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
    let mut shared = Vec::new();
    if plan.h2 {
        for target in &plan.targets {
            if let Conn::H2(sender) = client::connect(target, true).await? {
                shared.push(sender);
            }
        }
    }
    let mut workers = Vec::with_capacity(plan.concurrency);
    for i in 0..plan.concurrency {
        let conn = match shared.get(i % plan.targets.len()) {
            Some(sender) => Conn::H2(sender.clone()),
            None => client::connect(&plan.targets[i % plan.targets.len()], false).await?,
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
    });
    let text = record.summary(elapsed, settings).to_string();
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
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
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
    let measure_from = Instant::now() + Duration::from_secs_f64(args.warmup);
    Ok(Arc::new(Plan {
        targets,
        method,
        headers,
        body,
        concurrency: args.concurrency,
        h2: args.h2,
        rate: args.rate,
        measure_from,
        until: measure_from + Duration::from_secs_f64(args.duration),
        counter: AtomicU64::new(0),
    }))
}
