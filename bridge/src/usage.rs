//! What a client has left of a rule, without spending any of it: the operator's view of a
//! bucket (`ratelimit-bridge usage`, `GET /admin/usage`). The plugin configuration is read
//! by the filter's own parser and the key made by the filter's own code from the values an
//! operator types (`alice`), so usage names exactly the bucket a gateway checks. The
//! bucket is read by the script's `peek` mode with a cost of 0: nothing is taken or written,
//! and the answer is the level now (whole tokens) and when the bucket is full again.

use crate::overrides::{overridden, Table, Target};
use crate::registry;
use crate::store::Store;
use ratelimit_filter::config::Config;
use ratelimit_protocol::RuleSpec;
use serde_json::{json, Value};
use std::path::Path;

/// Reads and validates a plugin configuration as the gateways do.
pub fn load_plugin(path: &Path) -> Result<Config, String> {
    let context = |why: String| format!("{}: {why}", path.display());
    let json = std::fs::read(path).map_err(|e| context(format!("cannot read it: {e}")))?;
    Config::parse(&json).map_err(|e| context(format!("{}: {}", e.field, e.problem)))
}

/// Whose usage of which rule.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub rule: String,
    /// One per identity of the rule's key, in order, as a gateway sees them.
    pub values: Vec<String>,
    /// The client's tier, for a rule with tiers.
    pub tier: Option<String>,
}

/// The usage of `query` as one JSON object: the rule and its bucket key, `limit` (the
/// burst in force), `remaining` (whole tokens now), `reset` (Unix seconds when the bucket
/// is full again, by Redis's clock), the active `override` (or null) and `blocked`.
pub async fn usage(store: &Store, config: &Config, query: &Query) -> Result<Value, String> {
    let Some(rule) = config.rules.iter().find(|r| r.name == query.rule) else {
        let names: Vec<&str> = config.rules.iter().map(|r| r.name.as_str()).collect();
        return Err(format!(
            "no rule {:?} in the configuration (its rules: {})",
            query.rule,
            names.join(", ")
        ));
    };
    if query.values.len() != rule.key.len() {
        let identities: Vec<&str> = rule
            .key
            .iter()
            .filter_map(|&i| config.identities.get(i).map(|id| id.name.as_str()))
            .collect();
        return Err(format!(
            "rule {:?} is keyed on [{}]: give one value for each, in that order (got {})",
            rule.name,
            identities.join(", "),
            query.values.len()
        ));
    }
    if let Some(tier) = &query.tier {
        if !rule.tiers.iter().any(|(name, _)| name == tier) {
            return Err(format!("rule {:?} has no tier {tier:?}", rule.name));
        }
    }
    let target = Target::new(&config.key_prefix, &rule.name, &query.values)?;
    let limit = rule.limit_for(query.tier.as_deref());
    let mut spec = RuleSpec {
        key: target.key.clone(),
        burst: limit.burst,
        num: limit.num,
        den: limit.den,
        cost: 0,
    };
    let active = registry::list(store, &config.key_prefix).await?;
    let table = Table::new(active);
    let found = table.find(&spec.key);
    if let Some(o) = found {
        overridden(&mut spec, &o.limit);
    }
    let (now_ms, outcomes) = store.peek(&vec![spec.clone()]).await?;
    let Some(outcome) = outcomes.first() else {
        return Err("the script gave no answer for the bucket".into());
    };
    Ok(json!({
        "rule": rule.name,
        "key": spec.key,
        "limit": spec.burst,
        "remaining": outcome.remaining,
        "reset": now_ms.saturating_add(outcome.full_ms).div_ceil(1000),
        "override": found.map(|o| o.to_json()),
        // Automatic blocking (per-rule, kept in the bucket's stored value) is not read yet.
        "blocked": Value::Null,
    }))
}
