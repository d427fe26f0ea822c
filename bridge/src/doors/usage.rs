//! What a client has left of a rule, without spending any of it: the operator's view of a
//! bucket (`ratelimit-bridge usage`, `GET /admin/usage`). The plugin configuration is read
//! by the filter's own parser and the key made by the filter's own code (`ratelimit-config`)
//! from the values an operator types (`alice`), so usage names exactly the bucket a gateway
//! checks. The bucket is read by the script's `read` mode: nothing is taken or written (not
//! even a denial's count, which a check of a bucket in debt would make, so that looking
//! could block the client), and the answer is the level now in whole tokens, below 0 for
//! a metered rule's debt, when the bucket is full again, and a block in force.

use crate::engine::calendar;
use crate::engine::overrides::registry;
use crate::engine::overrides::table::{overridden, Table};
use crate::engine::overrides::Target;
use crate::engine::plans::{self, table::InForce};
use crate::engine::Engine;
use ratelimit_config::config::Config;
use ratelimit_protocol::calendar::Calendar;
use ratelimit_protocol::slot::Slot;
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

/// The bucket `query` names: its rule and the rule spec to read it with (the limit of the
/// client's tier, the rule's block so that a block shows, and a cost of 0, which a read
/// takes nothing of anyway); or why the query does not fit the configuration. Pure:
/// nothing is read yet.
pub fn bucket(config: &Config, query: &Query) -> Result<(String, RuleSpec), String> {
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
    let spec = RuleSpec {
        key: target.key,
        burst: limit.burst,
        num: limit.num,
        den: limit.den,
        cost: 0,
        lease: 0,
        // As the gateway sends it: a rule in shadow mode never blocks.
        block: rule.block.filter(|_| !rule.shadow).map(|b| b.wire),
        shadow: rule.shadow,
        overridden: None,
        settle: None,
        global: rule.global.clone(),
        // An in-flight rule's set is read with an id it never holds: its slots held.
        slot: rule.in_flight.map(|f| Slot {
            ttl_ms: f.ttl_ms,
            id: "usage".into(),
        }),
        calendar: (rule.calendar(&limit)).map(|(period, zone)| Calendar {
            period,
            zone: zone.to_string(),
        }),
        bounds: None,
        plan: None,
    };
    Ok((rule.name.clone(), spec))
}

/// The usage of the bucket `spec` of `rule` under `prefix` as one JSON object: the rule and
/// its bucket key, `limit` (the burst in force), `remaining` (whole tokens now, never below
/// 0), `owed` (whole tokens of a metered rule's debt, 0 when none: a bucket in debt has 0
/// remaining), `reset` (Unix seconds when the bucket is full again, by Redis's clock), the
/// client's `plan` (or null), the active `override` (or null) and `blocked` (null, or
/// `{"until": Unix seconds}` while the rule's automatic block refuses the client;
/// `remaining` is then 0). Read through the
/// `engine`: its store, and its regions for a global rule's ledger. Fails only when Redis
/// does.
pub async fn read(
    engine: &Engine,
    prefix: &str,
    rule: &str,
    mut spec: RuleSpec,
) -> Result<Value, String> {
    let store = engine.store();
    // The client's plan, then an override over it, as a check applies them.
    let plan = plans::registry::find(store, prefix, &spec.key).await?;
    if let Some(plan) = plan.clone() {
        plans::table::put(&mut spec, &InForce::of(plan).1);
    }
    let table = Table::new(registry::list(store, prefix).await?);
    let found = table.find(&spec.key);
    if let Some(o) = found {
        overridden(&mut spec, o);
    }
    calendar::bound(std::slice::from_mut(&mut spec))?;
    let (now_ms, outcomes) = store.read(&vec![spec.clone()]).await?;
    let Some(outcome) = outcomes.first() else {
        return Err("redis: the script gave no answer for the bucket".into());
    };
    // A global rule's budget is its ledger's, at its home region (null: not a global rule,
    // or a bridge without --region, which checks it as a plain one).
    let global = match engine.regions() {
        Some(regions) => regions.ledger_of(&spec).await.transpose()?,
        None => None,
    };
    // A blocked client has nothing left whatever its bucket holds: what a gateway says.
    Ok(json!({
        "global": global,
        "rule": rule,
        "key": spec.key,
        "limit": spec.overridden.map_or(spec.burst, |o| o.burst),
        "remaining": if outcome.blocked { 0 } else { outcome.remaining },
        "owed": outcome.owed,
        "reset": now_ms.saturating_add(outcome.full_ms).div_ceil(1000),
        "override": found.map(|o| o.to_json()),
        "plan": plan.map(|p| p.to_json()),
        "blocked": outcome.blocked.then(|| {
            json!({"until": now_ms.saturating_add(outcome.wait_ms).div_ceil(1000)})
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLUGIN: &str = r#"{
        "backend": {"cluster": "bridge"}, "key_prefix": "edge",
        "identity": {"user": {"header": "x-user-id"}, "ip": {"source": "peer"},
                     "tier": {"header": "x-tier", "trusted": true}},
        "rules": [
            {"name": "per-user", "key": ["user", "ip"], "limit": {"requests": 3, "per": "1m"},
             "tiers": {"gold": {"requests": 30, "per": "1m", "burst": 60}},
             "block": {"after": 5, "within": "1m", "for": "15m"}},
            {"name": "global", "limit": {"requests": 100, "per": "1s"}}
        ]}"#;

    fn query(rule: &str, values: &[&str], tier: Option<&str>) -> Query {
        Query {
            rule: rule.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
            tier: tier.map(str::to_string),
        }
    }

    #[test]
    fn the_bucket_is_the_gateways_own() {
        let config = Config::parse(PLUGIN.as_bytes()).unwrap();
        let (rule, spec) =
            bucket(&config, &query("per-user", &["Al ice", "10.0.0.1"], None)).unwrap();
        assert_eq!(rule, "per-user");
        assert_eq!(spec.key, "edge:per-user:Al%20ice:10.0.0.1");
        assert_eq!(
            (spec.burst, spec.num, spec.den, spec.cost),
            (3, 1, 20_000, 0)
        );
        let (_, gold) = bucket(&config, &query("per-user", &["a", "b"], Some("gold"))).unwrap();
        assert_eq!((gold.burst, gold.num, gold.den), (60, 1, 2000));
        let (_, global) = bucket(&config, &query("global", &[], None)).unwrap();
        assert_eq!(global.key, "edge:global");
    }

    #[test]
    fn queries_that_do_not_fit_the_configuration_say_why() {
        let config = Config::parse(PLUGIN.as_bytes()).unwrap();
        let why = |q: Query| bucket(&config, &q).unwrap_err();
        assert!(why(query("nope", &[], None)).contains("per-user, global"));
        assert!(why(query("per-user", &["a"], None)).contains("[user, ip]"));
        assert!(why(query("per-user", &["a", "b"], Some("silver"))).contains("no tier"));
        assert!(why(query("per-user", &["a", " "], None)).contains("empty"));
    }
}
