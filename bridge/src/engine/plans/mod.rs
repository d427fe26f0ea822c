//! Plans: per-client limits that operators or a billing system write (`plan set`, `plan
//! import`, `PUT /admin/plans`), with no expiry, each named (`pro`, `enterprise`) so that
//! the metrics count checks per plan, never per client. A client's own plan decides its
//! bucket instead of the limit its gateway sent (the rule's, or its tier's); an emergency
//! override still beats both. A plan names one bucket key exactly, as a per-client
//! override does.
//!
//! Unlike an override, a plan *is* the client's limit: the script runs the rule's own bucket
//! with the plan's burst and rate, and the gateway shows the plan's size
//! (`RuleResult::limit`). On a calendar quota a plan's `requests` is the period's quota; on
//! an in-flight rule, its most slots.
//!
//! - `records`: a plan's record, the keys it lives under in Redis, and its change log.
//! - `table`: the plans in force, found by bucket key and put on a check's rules.
//! - `registry`: the records in Redis: set, clear, import, list, and the refresh that
//!   reads each change once (every 250 ms) rather than every plan.

pub mod records;
pub mod registry;
pub mod table;

use super::overrides::Target;
use crate::store::keyspace::is_name;
use ratelimit_config::limit::{parse_duration_ms, Limit};
use std::sync::Arc;

/// A client's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub target: Target,
    /// What the metrics call it (a name: letters, digits, `._-`).
    pub name: Arc<str>,
    pub limit: Limit,
}

impl Plan {
    /// `name`'s `requests` per `per` (a duration) with a bucket of `burst` (default
    /// `requests`) for the client `target`, validated as the plugin validates its limits.
    pub fn new(
        target: Target,
        name: &str,
        requests: u64,
        per: &str,
        burst: Option<u64>,
    ) -> Result<Plan, String> {
        if !is_name(name) {
            return Err(format!(
                "plan {name:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
            ));
        }
        if target.rule_wide() {
            return Err(format!(
                "a plan is one client's: name it with a --value for each identity of rule {:?}",
                target.rule
            ));
        }
        let per_ms = parse_duration_ms(per).ok_or_else(|| {
            format!("per: {per:?} is not a duration like 500ms, 10s, 1m, 1h or 1d")
        })?;
        let limit = Limit::new(requests, per_ms, burst, 1)
            .map_err(|(field, why)| format!("{field}: {why}"))?;
        Ok(Plan {
            target,
            name: name.into(),
            limit,
        })
    }

    /// As operators see it (`plan list`, the admin endpoints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "key": self.target.key,
            "rule": self.target.rule,
            "plan": &*self.name,
            "requests": self.limit.requests,
            "per_ms": self.limit.per_ms,
            "burst": self.limit.burst,
        })
    }
}
