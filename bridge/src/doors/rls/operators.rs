//! The service's buckets as the operator's commands name them (`override`, `usage`, and
//! their admin endpoints): a domain and a descriptor's entries typed as Envoy sends them
//! (`--domain edge --entry remote_address=198.51.100.4`), made into the key the service
//! itself makes (`lines::bucket_of`), so an override or a usage names exactly the bucket a
//! call checks.

use super::limits::{Limits, Quota};
use super::lines::{bucket_of, spec};
use super::proto::Entry;
use crate::engine::overrides::Target;
use crate::store::keyspace::is_name;
use ratelimit_config::keys::SERVICE_RULE;
use ratelimit_protocol::RuleSpec;

/// An entry as typed: `key=value` (split at the first `=`), or, for an override's last
/// entry only, `key` alone: every value of it.
fn split(typed: &str) -> (&str, Option<&str>) {
    match typed.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (typed, None),
    }
}

/// The buckets of `domain` whose descriptors start with `entries` (all of the domain's
/// without any) under `prefix`: what an override set on them covers.
pub fn target(prefix: &str, domain: &str, entries: &[String]) -> Result<Target, String> {
    if !is_name(prefix) {
        return Err(format!(
            "key prefix {prefix:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
        ));
    }
    if domain.is_empty() {
        return Err("the domain is empty".into());
    }
    let mut parts = Vec::with_capacity(entries.len() * 2);
    for (i, typed) in entries.iter().enumerate() {
        match split(typed) {
            ("", _) => return Err(format!("entry {typed:?} has an empty key")),
            (key, Some(value)) => parts.extend([key, value]),
            (key, None) if i + 1 == entries.len() => parts.push(key),
            (_, None) => {
                return Err(format!(
                    "entry {typed:?} is not key=value (only the last may be a key alone: \
                     every value of it)"
                ))
            }
        }
    }
    Ok(Target {
        prefix: prefix.to_owned(),
        rule: SERVICE_RULE.to_owned(),
        key: bucket_of(prefix, domain, parts),
    })
}

/// The bucket a call of `domain`'s descriptor `entries` (each `key=value`) checks under
/// `prefix`, as `usage` reads it: its configured path and the spec to read it with, or why
/// no bucket answers that descriptor.
pub fn bucket(
    limits: &Limits,
    prefix: &str,
    domain: &str,
    entries: &[String],
) -> Result<(String, RuleSpec), String> {
    let entries: Vec<Entry> = entries
        .iter()
        .map(|typed| match split(typed) {
            (key, Some(value)) => Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }),
            (_, None) => Err(format!("entry {typed:?} is not key=value")),
        })
        .collect::<Result<_, _>>()?;
    let pairs = entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
    let Some(rule) = limits.find(domain, pairs) else {
        return Err(format!(
            "no limit in domain {domain:?} for the descriptor {entries:?}"
        ));
    };
    let Quota::Bucket(limit) = rule.quota else {
        return Err(format!(
            "the descriptor's limit {} has no bucket (unlimited, or 0)",
            rule.label.key
        ));
    };
    let spec = spec(prefix, domain, &entries, rule, &limit, 0);
    Ok((rule.label.key.clone(), spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tenant
    value: 'a*'
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: open
    rate_limit: {unlimited: true}
";

    fn typed(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn targets_name_the_keys_calls_make() {
        let at = |entries: &[&str]| target("rl", "edge", &typed(entries)).map(|t| t.key);
        assert_eq!(at(&[]).unwrap(), "rl:rls:edge");
        assert_eq!(
            at(&["remote_address"]).unwrap(),
            "rl:rls:edge:remote_address"
        );
        assert_eq!(
            at(&["remote_address=2001:db8::1"]).unwrap(),
            "rl:rls:edge:remote_address:2001%3Adb8%3A%3A1"
        );
        assert_eq!(at(&["k=a=b"]).unwrap(), "rl:rls:edge:k:a=b");
        assert!(at(&["k", "j=v"]).unwrap_err().contains("only the last"));
        assert!(at(&["=v"]).unwrap_err().contains("empty key"));
        assert!(target("rl", "", &[])
            .unwrap_err()
            .contains("domain is empty"));
        assert_eq!(
            target("rl", "edge", &[]).unwrap().scope(),
            "domain",
            "a domain-wide override"
        );
        let one = target("rl", "edge", &typed(&["remote_address=1.2.3.4"])).unwrap();
        assert_eq!(one.scope(), "descriptor");
    }

    #[test]
    fn usage_finds_the_bucket_a_call_checks() {
        let limits = Limits::parse([("edge.yaml", YAML)], false).unwrap();
        let (path, spec) =
            bucket(&limits, "rl", "edge", &typed(&["remote_address=1.2.3.4"])).unwrap();
        assert_eq!(path, "remote_address");
        assert_eq!(spec.key, "rl:rls:edge:remote_address:1.2.3.4");
        assert_eq!((spec.burst, spec.cost), (10, 0));
        // A shared wildcard's bucket is keyed on its pattern, whatever value is typed.
        let (_, shared) = bucket(&limits, "rl", "edge", &typed(&["tenant=abc"])).unwrap();
        assert_eq!(shared.key, "rl:rls:edge:tenant:a%2A");
        let why = |entries: &[&str]| bucket(&limits, "rl", "edge", &typed(entries)).unwrap_err();
        assert!(why(&["nope=1"]).contains("no limit"));
        assert!(why(&["open=1"]).contains("no bucket"));
        assert!(why(&["remote_address"]).contains("not key=value"));
    }
}
