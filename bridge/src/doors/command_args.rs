//! What the operator's commands share: where they connect (`Scope`: Redis and the key
//! prefix), which buckets they name (`Which`: a plugin rule's client, or the rate limit
//! service's descriptor), and their patience with Redis. `commands` and `plan_commands`
//! both build on them.

use crate::doors::rls;
use crate::engine::overrides::Target;
pub use crate::store::connection::redis_args::RedisArgs;
use crate::store::StoreOptions;
use clap::Args;
use std::time::Duration;

/// Which overrides: the key prefix (the plugin's `key_prefix`).
#[derive(Args, Debug)]
pub struct Scope {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The plugin's `key_prefix`.
    #[arg(long, default_value = "rl")]
    pub key_prefix: String,
}

/// Which buckets: a plugin rule, and a client of it (for `unblock`, without --value: the
/// bucket of a rule keyed on nothing); or the rate limit service's, by domain and entries.
#[derive(Args, Debug)]
pub struct Which {
    /// The rule's name.
    #[arg(long, required_unless_present = "domain")]
    pub rule: Option<String>,
    /// A value of the rule's key as a gateway sees it (`alice`, `198.51.100.4`), once per
    /// identity of the key, in order. None: for `override`, every client of the rule; for
    /// `usage` and `unblock`, the one bucket of a rule keyed on nothing.
    #[arg(long = "value", value_name = "CLIENT", conflicts_with = "domain")]
    pub values: Vec<String>,
    /// The rate limit service's buckets of this domain (instead of --rule).
    #[arg(long, conflicts_with = "rule")]
    pub domain: Option<String>,
    /// With --domain: a descriptor's entry as Envoy sends it, `key=value`, once per entry,
    /// in order. For `override`, the buckets of every descriptor starting with them (none:
    /// the whole domain), and the last may be a key alone (every value of it).
    #[arg(long = "entry", value_name = "KEY=VALUE", requires = "domain")]
    pub entries: Vec<String>,
}

impl Which {
    /// The buckets named under `prefix`.
    pub fn target(&self, prefix: &str) -> Result<Target, String> {
        match (&self.domain, &self.rule) {
            (Some(domain), _) => rls::operators::target(prefix, domain, &self.entries),
            (None, Some(rule)) => Target::new(prefix, rule, &self.values),
            (None, None) => Err("--rule or --domain names the buckets".into()),
        }
    }
}

#[derive(Args, Debug)]
pub struct ClearArgs {
    #[command(flatten)]
    pub scope: Scope,
    #[command(flatten)]
    pub which: Which,
}

/// Patience for one command: more than a check's, as nothing waits on it.
pub const OPTIONS: StoreOptions = StoreOptions {
    connect_timeout: Duration::from_secs(2),
    response_timeout: Duration::from_secs(2),
};

/// A limit as the configuration writes one, for what replaces a rule's (an override, a
/// plan).
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// Refill: this many requests every --per (a plan on a calendar quota: the period's
    /// quota; on an in-flight rule: the most in flight).
    #[arg(long, value_name = "N")]
    pub requests: u64,
    /// The refill period: 500ms, 10s, 1m, 1h, 1d.
    #[arg(long, value_name = "D")]
    pub per: String,
    /// The bucket's capacity (default: --requests).
    #[arg(long, value_name = "B")]
    pub burst: Option<u64>,
}
