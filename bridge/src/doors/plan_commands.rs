//! The `plan` commands, for operators and billing systems: `set`, `clear` and `list` one
//! client's plan, and `import` many at once from JSON lines (a hundred thousand in seconds:
//! `BATCH` per script call). Each connects to Redis as the server does and prints one line
//! of JSON; every bridge applies what they write within a second.

use crate::doors::command_args::{ClearArgs, LimitArgs, Scope, Which, OPTIONS};
use crate::engine::overrides::Target;
use crate::engine::plans::registry::{self, BATCH};
use crate::engine::plans::Plan;
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand, Debug)]
pub enum PlanCommand {
    /// Sets (or replaces) one client's plan: its limit on a rule, named for the metrics.
    Set(PlanArgs),
    /// Prints every plan under the key prefix.
    List(Scope),
    /// Removes a client's plan: the rule's limit applies to it again.
    Clear(ClearArgs),
    /// Sets many plans from JSON lines, one plan a line: {"rule": "chat", "values":
    /// ["alice"], "plan": "pro", "requests": 1000, "per": "1m", "burst": 2000 (optional)}.
    /// Every line is checked before anything is written.
    Import(ImportArgs),
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub scope: Scope,
    #[command(flatten)]
    pub which: Which,
    /// The plan's name, as the metrics count it (`pro`, `enterprise`).
    #[arg(long = "plan", value_name = "NAME")]
    pub name: String,
    #[command(flatten)]
    pub limit: LimitArgs,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// The JSON lines, or `-` for standard input.
    #[arg(value_name = "PLANS.jsonl")]
    pub path: PathBuf,
}

/// One line of an import.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    rule: String,
    #[serde(default)]
    values: Vec<String>,
    plan: String,
    requests: u64,
    per: String,
    burst: Option<u64>,
}

/// Runs `command`; what it prints.
pub async fn run(command: PlanCommand) -> Result<Value, String> {
    Ok(match command {
        PlanCommand::Set(args) => {
            let store = args.scope.redis.store(OPTIONS)?;
            let target = plugin_target(&args.which, &args.scope.key_prefix)?;
            let l = &args.limit;
            let plan = Plan::new(target, &args.name, l.requests, &l.per, l.burst)?;
            registry::set(&store, std::slice::from_ref(&plan)).await?;
            plan.to_json()
        }
        PlanCommand::List(scope) => {
            let store = scope.redis.store(OPTIONS)?;
            let (_, plans) = registry::list(&store, &scope.key_prefix).await?;
            plans.iter().map(Plan::to_json).collect()
        }
        PlanCommand::Clear(args) => {
            let store = args.scope.redis.store(OPTIONS)?;
            let target = plugin_target(&args.which, &args.scope.key_prefix)?;
            let cleared = registry::clear(&store, std::slice::from_ref(&target)).await?;
            json!({"key": target.key, "cleared": cleared > 0})
        }
        PlanCommand::Import(args) => {
            let plans = read_rows(&args.path, &args.scope.key_prefix)?;
            let store = args.scope.redis.store(OPTIONS)?;
            let started = Instant::now();
            let written = registry::set(&store, &plans).await?;
            json!({
                "imported": written,
                "calls": plans.len().div_ceil(BATCH),
                "seconds": started.elapsed().as_secs_f64(),
            })
        }
    })
}

/// A plugin rule's client: plans are not the rate limit service's.
fn plugin_target(which: &Which, prefix: &str) -> Result<Target, String> {
    if which.domain.is_some() {
        return Err("plans name a plugin rule's clients (--rule, --value)".into());
    }
    which.target(prefix)
}

/// Every plan of the JSON lines at `path` (`-`: standard input), or the first line at
/// fault and why.
fn read_rows(path: &PathBuf, prefix: &str) -> Result<Vec<Plan>, String> {
    let name = path.display();
    let input: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).map_err(|e| format!("{name}: {e}"))?)
    };
    let mut plans = Vec::new();
    for (n, line) in BufReader::new(input).lines().enumerate() {
        let line = line.map_err(|e| format!("{name}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = |e: String| format!("{name}:{}: {e}", n + 1);
        let row: Row = serde_json::from_str(&line).map_err(|e| at(e.to_string()))?;
        let target = Target::new(prefix, &row.rule, &row.values).map_err(at)?;
        let plan = Plan::new(target, &row.plan, row.requests, &row.per, row.burst).map_err(at)?;
        plans.push(plan);
    }
    Ok(plans)
}
