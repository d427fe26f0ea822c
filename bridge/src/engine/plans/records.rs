//! Where plans live in Redis, under each key prefix: a hash of records
//! (`<prefix>:{plans}`, field = the target without its prefix, `rule:value...`), the change
//! log bridges follow (`<prefix>:{plans}:log`, a stream whose entry `<seq>-0` lists the
//! members one call changed, each with its record or `''` if removed) and the number of the
//! last change (`<prefix>:{plans}:seq`). All three share the hash tag `{plans}`, which no
//! bucket key can reach (see `overrides::records`): one script call writes them together,
//! on a Cluster too. None expires: a plan is a contract, never what `maxmemory` evicts.
//!
//! A record is `<plan> <requests> <per_ms> <burst>`.

use super::Plan;
use crate::engine::overrides::Target;
use crate::store::keyspace::is_name;
use ratelimit_config::limit::Limit;

const NAMESPACE: &str = "{plans}";

/// The hash of `prefix`'s plans.
pub fn plans_key(prefix: &str) -> String {
    format!("{prefix}:{NAMESPACE}")
}

/// The change log of `prefix`'s plans.
pub fn log_key(prefix: &str) -> String {
    format!("{prefix}:{NAMESPACE}:log")
}

/// The number of `prefix`'s last change.
pub fn seq_key(prefix: &str) -> String {
    format!("{prefix}:{NAMESPACE}:seq")
}

/// A plan's record.
pub fn encode(plan: &Plan) -> String {
    let l = &plan.limit;
    format!("{} {} {} {}", plan.name, l.requests, l.per_ms, l.burst)
}

/// Reads the record of `member` under `prefix`.
pub fn decode(prefix: &str, member: &str, value: &str) -> Result<Plan, String> {
    let bad = || format!("plan record {prefix}:{NAMESPACE} {member:?}: {value:?}");
    let mut words = value.split(' ');
    let name = words.next().filter(|n| is_name(n)).ok_or_else(bad)?;
    let numbers: Vec<u64> = words
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let [requests, per_ms, burst] = numbers[..] else {
        return Err(bad());
    };
    let limit = Limit::new(requests, per_ms, Some(burst), 1).map_err(|_| bad())?;
    let rule = member.split(':').next().unwrap_or_default();
    if !is_name(rule) || !member.contains(':') {
        return Err(bad());
    }
    Ok(Plan {
        target: Target {
            prefix: prefix.into(),
            rule: rule.into(),
            key: format!("{prefix}:{member}"),
        },
        name: name.into(),
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_its_plan_and_nothing_else_reads_as_one() {
        let target = Target::new("rl", "chat", &["alice".into()]).unwrap_or_else(|e| {
            unreachable!("{e}");
        });
        let plan = Plan::new(target, "pro", 1000, "1m", Some(2000));
        let Ok(plan) = plan else {
            unreachable!("a valid plan")
        };
        let record = encode(&plan);
        assert_eq!(record, "pro 1000 60000 2000");
        assert_eq!(decode("rl", "chat:alice", &record), Ok(plan));
        for (member, value) in [
            ("chat", "pro 1000 60000 2000"),
            ("chat:alice", "pro 1000 60000"),
            ("chat:alice", "pro 1000 60000 2000 1"),
            ("chat:alice", "p r o 1000 60000 2000"),
            ("chat:alice", "pro 0 60000 2000"),
            ("chat:alice", "pro -1 60000 2000"),
            ("ch{at:alice", "pro 1 60000 2000"),
            ("chat:alice", ""),
        ] {
            assert!(decode("rl", member, value).is_err(), "{member} {value}");
        }
    }
}
