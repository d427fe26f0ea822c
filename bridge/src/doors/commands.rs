//! The operator's commands, beside serving: `override set|list|clear`, `plan` (its own
//! module, `plan_commands`), `unblock` and `usage`, each of which connects to Redis as the
//! server does (the same `--redis`,
//! `--cluster`, `--sentinel`, TLS and credential flags, `RedisArgs`), does one thing, and
//! prints one line of JSON; and `check-config`, which reads no Redis and prints what a
//! gateway would log.

use crate::doors::command_args::OPTIONS;
pub use crate::doors::command_args::{ClearArgs, LimitArgs, RedisArgs, Scope, Which};
use crate::doors::plan_commands::{self, PlanCommand};
use crate::doors::rls;
use crate::doors::usage::{self, Query};
use crate::engine::calendar;
use crate::engine::overrides::registry;
use crate::engine::overrides::{parse_spec, Override};
use crate::engine::regions::flags::RegionArgs;
use crate::engine::unblock::unblock;
use crate::engine::Engine;
use clap::{Args, Subcommand, ValueEnum};
use ratelimit_config::loading::{self, Build};
use ratelimit_protocol::RuleSpec;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

/// An operator's command.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Emergency overrides: replace a rule's limit for one client or for all of its
    /// clients, on every gateway within a second, until they expire.
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Clients' plans: a client's own limit on a rule, named, without expiry, on every
    /// gateway within a second.
    #[command(subcommand)]
    Plan(PlanCommand),
    /// Lifts a client's automatic block (a rule's `block`) on every gateway within a
    /// second, keeping its bucket's level; prints whether it was blocked.
    Unblock(ClearArgs),
    /// Prints one client's usage of a rule (limit, remaining, owed, reset, override,
    /// blocked) as JSON, taking and writing nothing.
    Usage(UsageArgs),
    /// Validates a plugin configuration offline with the filter's own parser, as a gateway
    /// loads it: prints the line the gateway would log, and exits 1 if it would refuse it.
    CheckConfig(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The plugin configuration (JSON: Istio's `pluginConfig`, Envoy's `configuration`,
    /// Kong's `config`), or `-` for standard input.
    #[arg(value_name = "PLUGIN.json")]
    pub path: PathBuf,
    /// The build of the filter that loads it: `bridge` (ratelimit.wasm) or `redis-call`
    /// (ratelimit-redis.wasm, Higress).
    #[arg(long, value_enum, default_value = "bridge")]
    pub build: FilterBuild,
    /// Judge the path as the rate limit service's configuration instead (`--rls-config`:
    /// envoyproxy/ratelimit's YAML, a file or a directory of them).
    #[arg(long, conflicts_with = "build")]
    pub rls: bool,
    /// With --rls: the files of one domain merged, as --rls-merge-domains serves them.
    #[arg(long, env = "RATELIMIT_BRIDGE_RLS_MERGE_DOMAINS")]
    pub rls_merge_domains: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum FilterBuild {
    Bridge,
    RedisCall,
}

#[derive(Subcommand, Debug)]
pub enum OverrideCommand {
    /// Sets (or replaces) the override of a rule, for one client or, without --value, for
    /// every client of the rule.
    Set(SetArgs),
    /// Prints the active overrides.
    List(Scope),
    /// Removes an override before it expires.
    Clear(ClearArgs),
}

#[derive(Args, Debug)]
pub struct SetArgs {
    #[command(flatten)]
    pub scope: Scope,
    #[command(flatten)]
    pub which: Which,
    #[command(flatten)]
    pub limit: LimitArgs,
    /// How long the override lasts; Redis expires it then.
    #[arg(long, value_name = "D")]
    pub ttl: String,
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// A global rule's ledger is read at its home region's Redis (the server's flags).
    #[command(flatten)]
    pub regions: RegionArgs,
    /// The plugin configuration (JSON) the gateways load: its key prefix, rules and
    /// identities name the bucket.
    #[arg(
        long,
        value_name = "PLUGIN.json",
        required_unless_present = "rls_config"
    )]
    pub config: Option<PathBuf>,
    /// With --domain: the rate limit service's configuration (as --rls-config), whose
    /// limit of the descriptor names the bucket.
    #[arg(
        long,
        value_name = "PATH",
        requires = "domain",
        conflicts_with = "config"
    )]
    pub rls_config: Option<PathBuf>,
    /// With --rls-config: the files of one domain merged, as --rls-merge-domains.
    #[arg(long, requires = "rls_config")]
    pub rls_merge_domains: bool,
    /// With --rls-config: the key prefix the service keys its buckets under (the bridge's
    /// first --key-prefix).
    #[arg(long, default_value = "rl", requires = "rls_config")]
    pub key_prefix: String,
    #[command(flatten)]
    pub which: Which,
    /// The client's tier, for a rule with tiers.
    #[arg(long)]
    pub tier: Option<String>,
}

/// Runs `command`; what it prints.
pub async fn run(command: Command) -> Result<String, String> {
    let value = match command {
        Command::CheckConfig(args) => return check_config(&args),
        Command::Plan(command) => plan_commands::run(command).await?,
        Command::Override(OverrideCommand::Set(args)) => {
            let store = args.scope.redis.store(OPTIONS)?;
            let target = args.which.target(&args.scope.key_prefix)?;
            let l = &args.limit;
            let (limit, ttl_ms) = parse_spec(l.requests, &l.per, l.burst, &args.ttl)?;
            registry::set(&store, target, limit, ttl_ms)
                .await?
                .to_json()
        }
        Command::Override(OverrideCommand::List(scope)) => {
            let store = scope.redis.store(OPTIONS)?;
            let active = registry::list(&store, &scope.key_prefix).await?;
            active.iter().map(Override::to_json).collect()
        }
        Command::Override(OverrideCommand::Clear(args)) => {
            let store = args.scope.redis.store(OPTIONS)?;
            let target = args.which.target(&args.scope.key_prefix)?;
            let cleared = registry::clear(&store, &target).await?;
            serde_json::json!({"key": target.key, "cleared": cleared})
        }
        Command::Unblock(args) => {
            if args.which.domain.is_some() {
                return Err("the rate limit service's limits have no block to lift".into());
            }
            let store = args.scope.redis.store(OPTIONS)?;
            let target = args.which.target(&args.scope.key_prefix)?;
            let unblocked = unblock(&store, &target).await?;
            serde_json::json!({"key": target.key, "unblocked": unblocked})
        }
        Command::Usage(args) => {
            let (prefix, rule, spec) = usage_bucket(&args)?;
            let store = args.redis.store(OPTIONS)?;
            let regions = args.regions.regions(&args.redis, OPTIONS)?;
            let engine = Engine::new(store, regions.map(Arc::new));
            usage::read(&engine, &prefix, &rule, spec).await?
        }
    };
    Ok(value.to_string())
}

/// The bucket `usage` reads: its key prefix, its rule (a plugin rule, or the service's
/// configured descriptor) and the spec to read it with.
fn usage_bucket(args: &UsageArgs) -> Result<(String, String, RuleSpec), String> {
    if let (Some(path), Some(domain)) = (&args.rls_config, &args.which.domain) {
        let limits = rls::source::load(path, args.rls_merge_domains)
            .map_err(|e| format!("--rls-config {e}"))?;
        let (rule, spec) =
            rls::operators::bucket(&limits, &args.key_prefix, domain, &args.which.entries)?;
        return Ok((args.key_prefix.clone(), rule, spec));
    }
    let (Some(path), Some(rule)) = (&args.config, &args.which.rule) else {
        return Err(
            "usage names a plugin rule (--config, --rule) or the rate limit \
                    service's descriptor (--rls-config, --domain, --entry)"
                .into(),
        );
    };
    let config = usage::load_plugin(path).map_err(|e| format!("--config {e}"))?;
    let query = Query {
        rule: rule.clone(),
        values: args.which.values.clone(),
        tier: args.tier.clone(),
    };
    let (rule, spec) = usage::bucket(&config, &query)?;
    Ok((config.key_prefix, rule, spec))
}

/// `check-config`: the gateway's line for the configuration, as the success or the error.
fn check_config(args: &CheckArgs) -> Result<String, String> {
    let name = args.path.display();
    if args.rls {
        let limits = rls::source::load(&args.path, args.rls_merge_domains)?;
        return Ok(format!(
            "{name}: configured {} rate limit service domain(s)",
            limits.domains()
        ));
    }
    let mut json = Vec::new();
    let read = if args.path.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut json).map(drop)
    } else {
        std::fs::read(&args.path).map(|bytes| json = bytes)
    };
    read.map_err(|e| format!("{name}: cannot read it: {e}"))?;
    let build = match args.build {
        FilterBuild::Bridge => Build::Bridge,
        FilterBuild::RedisCall => Build::RedisCall,
    };
    match loading::load(&json, build) {
        Ok(config) => {
            // A time zone the bridge's database lacks would fail every check of its rule:
            // said here, where an operator checks before deploying, not at the first check.
            for (i, rule) in config.rules.iter().enumerate() {
                if let Some(zone) = &rule.time_zone {
                    calendar::known_zone(zone)
                        .map_err(|e| format!("{name}: rules[{i}].time_zone: {e}"))?;
                }
            }
            Ok(format!("{name}: {}", loading::accepted(&config)))
        }
        Err(e) => Err(format!("{name}: {}", loading::refused(&e))),
    }
}
