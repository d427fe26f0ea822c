//! Emergency overrides: a limit that replaces a rule's configured one, for one client or
//! for every client of the rule, until it expires, without touching any gateway's
//! configuration. This module is the pure part: what an override is, where its record lives
//! in Redis and how it is written there, and the table the bridge rewrites checks with.
//! `registry` reads and writes the records; `override_cache` keeps the table fresh.
//!
//! The bridge finds the overrides, the script runs them: a check whose bucket key has an
//! override is sent to the script with the override's burst, rate and end beside the
//! limit the gateway sent (`ratelimit_protocol::Overridden`). The override's own bucket
//! then decides, and the rule's bucket still pays what is admitted (never below 0), so
//! that an override that ends leaves the client where its rule would have. A per-client
//! override names one bucket key exactly (`rl:per-user:alice`); a rule-wide one covers
//! every key of the rule (`rl:per-user`, then `:` or the end). A per-client override wins
//! over a rule-wide one.

use crate::check::{Check, RuleSpec};
use crate::keyspace::is_name;
use ratelimit_config::keys::{self, bucket_key, SERVICE_RULE};
use ratelimit_config::limit::{parse_duration_ms, Limit};
use ratelimit_protocol::Overridden;
use std::collections::HashMap;

/// The segment after `<prefix>:` that every override record starts with. Bucket keys are
/// `<prefix>:<rule>[:<value>...]` (`ratelimit_protocol::key`), where a rule name holds only
/// `[A-Za-z0-9._-]` and a value only `[A-Za-z0-9._@+=!~%-]` (or `#` and hex digits), so no
/// bucket key can have a `{` after its prefix: no record can ever be read or overwritten as
/// a bucket, and no caller of the bridge can name one (`keyspace` refuses such checks). The braces are also a Redis Cluster hash tag: every record of
/// every prefix hashes to one slot, so a record and the index are written together by one
/// script call and listed with one `ZRANGE` and one `MGET`, on a Cluster too.
const NAMESPACE: &str = "{overrides}";

/// The sorted set that lists a prefix's overrides: member = target (`rule` or
/// `rule:value...`), score = the Redis time (ms) its record expires.
pub fn index_key(prefix: &str) -> String {
    format!("{prefix}:{NAMESPACE}")
}

/// The record of `target` under `prefix`: a string expiring (Redis `PX`) with the override.
pub fn record_key(prefix: &str, target: &str) -> String {
    format!("{prefix}:{NAMESPACE}:{target}")
}

/// Which buckets an override applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub prefix: String,
    pub rule: String,
    /// The bucket key (per client), or `<prefix>:<rule>` (the whole rule).
    pub key: String,
}

impl Target {
    /// The buckets of `rule` under `prefix` for the client whose identity values are
    /// `values` as a gateway sees them (escaped as the gateway escapes them), or every
    /// bucket of the rule when `values` is empty.
    pub fn new(prefix: &str, rule: &str, values: &[String]) -> Result<Target, String> {
        if !is_name(prefix) {
            return Err(format!(
                "key prefix {prefix:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
            ));
        }
        if !is_name(rule) {
            return Err(format!(
                "rule {rule:?} is not a name (1 to 64 letters, digits, '.', '_' or '-')"
            ));
        }
        if rule == SERVICE_RULE {
            return Err(format!(
                "rule {rule:?} is the rate limit service's: name its buckets by --domain and \
                 --entry"
            ));
        }
        let escaped = values
            .iter()
            .map(|v| keys::typed(v).ok_or_else(|| format!("value {v:?} is empty")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Target {
            prefix: prefix.into(),
            rule: rule.into(),
            key: bucket_key(prefix, rule, &escaped),
        })
    }

    /// What names the target in its record and in the index: the key without `prefix:`.
    pub fn member(&self) -> &str {
        self.key.get(self.prefix.len() + 1..).unwrap_or_default()
    }

    /// Whether it covers every client of the rule.
    pub fn rule_wide(&self) -> bool {
        !self.member().contains(':')
    }

    /// What it covers: a plugin rule's every client (`rule`) or one client (`client`); the
    /// rate limit service's whole domain (`domain`) or what a descriptor's leading entries
    /// name (`descriptor`).
    pub fn scope(&self) -> &'static str {
        match (
            self.rule == SERVICE_RULE,
            self.member().matches(':').count(),
        ) {
            (true, 1) => "domain",
            (true, _) => "descriptor",
            (false, 0) => "rule",
            (false, _) => "client",
        }
    }
}

/// An active override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub target: Target,
    pub limit: Limit,
    /// Redis time (Unix ms) at which it expires.
    pub expires_ms: u64,
}

impl Override {
    /// As operators see it (`override list`, `usage`, the admin endpoints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "key": self.target.key,
            "rule": self.target.rule,
            "scope": self.target.scope(),
            "requests": self.limit.requests,
            "per_ms": self.limit.per_ms,
            "burst": self.limit.burst,
            "expires": self.expires_ms.div_ceil(1000),
        })
    }
}

/// The longest an override may last: a year. An emergency limit is not a configuration,
/// and every expiry stays an exact integer in Redis's milliseconds.
pub const MAX_TTL_MS: u64 = 365 * 86_400_000;

/// `requests` per `per` with a bucket of `burst` (default `requests`), lasting `ttl` (at
/// most `MAX_TTL_MS`): the limit and the lifetime in ms, validated as the plugin validates
/// its limits.
pub fn parse_spec(
    requests: u64,
    per: &str,
    burst: Option<u64>,
    ttl: &str,
) -> Result<(Limit, u64), String> {
    let duration = |name: &str, text: &str| {
        parse_duration_ms(text).ok_or_else(|| {
            format!("{name}: {text:?} is not a duration like 500ms, 10s, 1m, 1h or 1d")
        })
    };
    let per_ms = duration("per", per)?;
    let ttl_ms = duration("ttl", ttl)?;
    if ttl_ms > MAX_TTL_MS {
        return Err(format!(
            "ttl: {ttl:?} is longer than an override may last (365d)"
        ));
    }
    let limit =
        Limit::new(requests, per_ms, burst, 1).map_err(|(field, why)| format!("{field}: {why}"))?;
    Ok((limit, ttl_ms))
}

/// A record's value without its expiry, which the script appends from Redis's clock:
/// `<requests> <per_ms> <burst>`.
pub fn encode(limit: &Limit) -> String {
    format!("{} {} {}", limit.requests, limit.per_ms, limit.burst)
}

/// Reads the record of `member` under `prefix`: `<requests> <per_ms> <burst> <expires_ms>`.
pub fn decode(prefix: &str, member: &str, value: &str) -> Result<Override, String> {
    let bad = || {
        format!(
            "override record {:?}: {value:?}",
            record_key(prefix, member)
        )
    };
    let numbers: Vec<u64> = value
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let [requests, per_ms, burst, expires_ms] = numbers[..] else {
        return Err(bad());
    };
    let limit = Limit::new(requests, per_ms, Some(burst), 1).map_err(|_| bad())?;
    let rule = member.split(':').next().unwrap_or_default();
    if !is_name(rule) {
        return Err(bad());
    }
    Ok(Override {
        target: Target {
            prefix: prefix.into(),
            rule: rule.into(),
            key: format!("{prefix}:{member}"),
        },
        limit,
        expires_ms,
    })
}

/// The overrides in force, by the key they name (a bucket key, or `<prefix>:<rule>`).
#[derive(Debug, Default)]
pub struct Table {
    by_key: HashMap<String, Override>,
}

impl Table {
    pub fn new(overrides: impl IntoIterator<Item = Override>) -> Table {
        Table {
            by_key: overrides
                .into_iter()
                .map(|o| (o.target.key.clone(), o))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The override of the bucket `key`: its own, else its rule's. A bucket key's rule is
    /// its first two segments, as prefixes and rule names hold no `:`. A bucket of the rate
    /// limit service (`<prefix>:rls:<domain>:<key>:<value>...`) has, for a rule, its domain
    /// and its descriptor's leading entries: the longest of them with an override.
    pub fn find(&self, key: &str) -> Option<&Override> {
        if let Some(own) = self.by_key.get(key) {
            return Some(own);
        }
        let mut colons = key.match_indices(':').map(|(i, _)| i);
        let rule_start = colons.next()? + 1;
        let rule_end = colons.next().unwrap_or(key.len());
        if key.get(rule_start..rule_end) != Some(SERVICE_RULE) {
            return self
                .by_key
                .get(key.get(..rule_end)?)
                .filter(|o| o.target.rule_wide());
        }
        let mut end = key.len();
        while let Some(cut) = key.get(..end)?.rfind(':').filter(|&cut| cut > rule_end) {
            if let Some(o) = self.by_key.get(key.get(..cut)?) {
                return Some(o);
            }
            end = cut;
        }
        None
    }

    /// Puts its override on every rule of `check` that has one.
    pub fn apply(&self, check: &mut Check) {
        if self.is_empty() {
            return;
        }
        for rule in check.iter_mut() {
            if let Some(o) = self.find(&rule.key) {
                overridden(rule, o);
            }
        }
    }
}

/// `rule` under the override `o`, its limit as the gateway sent it kept beside. The
/// override's bucket always holds one request's cost, which the gateway's configuration
/// guarantees and an override may not (`--burst 1` for a rule of cost 5): such a client
/// gets one request per refill of its cost.
pub fn overridden(rule: &mut RuleSpec, o: &Override) {
    rule.overridden = Some(Overridden {
        burst: o.limit.burst.max(rule.cost),
        num: o.limit.num,
        den: o.limit.den,
        until_ms: o.expires_ms,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(key: &str) -> RuleSpec {
        RuleSpec::plain(key, 3, 1, 20_000, 1)
    }

    fn active(prefix: &str, rule: &str, values: &[&str], requests: u64) -> Override {
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        Override {
            target: Target::new(prefix, rule, &values).unwrap(),
            limit: Limit::new(requests, 60_000, None, 1).unwrap(),
            expires_ms: 1,
        }
    }

    #[test]
    fn records_never_share_a_name_with_a_bucket() {
        assert_eq!(index_key("rl"), "rl:{overrides}");
        assert_eq!(
            record_key("rl", "per-user:alice"),
            "rl:{overrides}:per-user:alice"
        );
        // Whatever the client sends, its value is escaped: no bucket holds a brace.
        let hostile = Target::new("rl", "r", &["{overrides}".into()]).unwrap();
        assert_eq!(hostile.key, "rl:r:%7Boverrides%7D");
        // And no key of the namespace is one a check may name (`keyspace`).
        for key in [
            index_key("rl"),
            record_key("rl", "r"),
            record_key("rl", "r:bob"),
        ] {
            assert!(ratelimit_protocol::key::parse_key(&key).is_err(), "{key}");
        }
        assert!(Target::new("rl", "{overrides}", &[]).is_err());
        assert!(Target::new("r:l", "r", &[]).is_err());
        assert!(Target::new("rl", "r", &[" ".into()]).is_err());
    }

    #[test]
    fn targets_are_typed_values_escaped_as_gateways_do() {
        let t = Target::new("rl", "per-user", &[" al ice ".into()]).unwrap();
        assert_eq!(
            (t.key.as_str(), t.member()),
            ("rl:per-user:al%20ice", "per-user:al%20ice")
        );
        assert!(!t.rule_wide());
        let all = Target::new("rl", "per-user", &[]).unwrap();
        assert_eq!((all.key.as_str(), all.rule_wide()), ("rl:per-user", true));
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_named() {
        let (limit, ttl) = parse_spec(10, "1m", Some(20), "30s").unwrap();
        assert_eq!(
            (limit.burst, limit.num, limit.den, ttl),
            (20, 1, 6000, 30_000)
        );
        let read = decode("rl", "per-user:alice", &format!("{} 99", encode(&limit))).unwrap();
        assert_eq!((read.limit, read.expires_ms), (limit, 99));
        assert_eq!(
            read.target,
            Target::new("rl", "per-user", &["alice".into()]).unwrap()
        );
        for bad in [
            "",
            "10 60000 20",
            "10 60000 20 x",
            "0 60000 1 5",
            "1 2 3 4 5",
        ] {
            let e = decode("rl", "r", bad).unwrap_err();
            assert!(e.contains("rl:{overrides}:r"), "{e}");
        }
        assert!(parse_spec(0, "1m", None, "1m")
            .unwrap_err()
            .starts_with("requests"));
        assert!(parse_spec(1, "soon", None, "1m")
            .unwrap_err()
            .starts_with("per"));
        assert!(parse_spec(1, "1m", None, "0s")
            .unwrap_err()
            .starts_with("ttl"));
        assert!(parse_spec(1, "1m", Some(0), "1m")
            .unwrap_err()
            .starts_with("burst"));
    }

    #[test]
    fn a_ttl_is_one_ms_to_a_year() {
        let ttl = |text: &str| parse_spec(1, "1m", None, text).map(|(_, ms)| ms);
        assert_eq!(ttl("1ms"), Ok(1));
        assert_eq!(ttl("365d"), Ok(MAX_TTL_MS));
        assert_eq!(ttl("8760h"), Ok(MAX_TTL_MS));
        for beyond in [
            "366d",
            "31536000001ms",
            "3650000d",
            "18446744073709551615ms",
        ] {
            let e = ttl(beyond).unwrap_err();
            assert!(
                e.starts_with("ttl: ") && e.contains("365d"),
                "{beyond}: {e}"
            );
        }
        for bad in ["0s", "0ms", "99999999999999999999d", "1y", "-1d", ""] {
            assert!(ttl(bad).unwrap_err().starts_with("ttl: "), "{bad}");
        }
    }

    #[test]
    fn a_client_override_wins_over_its_rules_and_touches_no_other_rule() {
        let table = Table::new([
            active("rl", "per-user", &[], 5),
            active("rl", "per-user", &["alice"], 2),
            active("rl", "global", &[], 7),
        ]);
        let burst = |key: &str| table.find(key).map(|o| o.limit.burst);
        assert_eq!(burst("rl:per-user:alice"), Some(2));
        assert_eq!(burst("rl:per-user:bob"), Some(5));
        assert_eq!(burst("rl:global"), Some(7));
        assert_eq!(burst("rl:per-user2:alice"), None);
        assert_eq!(burst("rl:per-user"), Some(5));
        assert_eq!(burst("edge:per-user:alice"), None);
        assert_eq!(burst("rl:per-users:bob"), None);
    }

    /// The rate limit service's buckets: a domain, or a descriptor's leading entries; the
    /// longest named wins, and nothing names them as a plugin rule.
    #[test]
    fn the_services_overrides_cover_a_domain_or_leading_entries() {
        let at = |member: &str, requests| Override {
            target: Target {
                prefix: "rl".into(),
                rule: SERVICE_RULE.into(),
                key: format!("rl:{member}"),
            },
            ..active("rl", "r", &[], requests)
        };
        let table = Table::new([
            at("rls:edge", 1),
            at("rls:edge:tenant:acme", 2),
            at("rls:edge:path", 3),
        ]);
        let burst = |key: &str| table.find(key).map(|o| o.limit.burst);
        assert_eq!(burst("rl:rls:edge:remote_address:1.2.3.4"), Some(1));
        assert_eq!(burst("rl:rls:edge:tenant:acme:path:x"), Some(2));
        assert_eq!(burst("rl:rls:edge:tenant:acme"), Some(2));
        assert_eq!(burst("rl:rls:edge:tenant:acme2"), Some(1));
        assert_eq!(burst("rl:rls:edge:path:x"), Some(3));
        assert_eq!(burst("rl:rls:edgy:path:x"), None, "another domain");
        assert_eq!(burst("rl:rls"), None);
        assert_eq!(burst("edge:rls:edge:path:x"), None, "another prefix");
        assert_eq!(burst("rl:edge:tenant"), None, "a plugin rule named edge");
        assert!(Target::new("rl", SERVICE_RULE, &[]).is_err());
        assert_eq!(
            table.find("rl:rls:edge:k:v").unwrap().target.scope(),
            "domain"
        );
    }

    #[test]
    fn applying_adds_the_override_and_keeps_the_rule() {
        let table = Table::new([active("rl", "per-user", &["alice"], 10)]);
        let mut check = vec![rule("rl:per-user:alice"), rule("rl:per-user:bob")];
        table.apply(&mut check);
        let o = check[0].overridden.unwrap();
        assert_eq!((o.burst, o.num, o.den, o.until_ms), (10, 1, 6000, 1));
        assert_eq!(
            (check[0].burst, check[0].num, check[0].den, check[0].cost),
            (3, 1, 20_000, 1),
            "the rule's own limit stays: its bucket still pays"
        );
        assert_eq!(check[1], rule("rl:per-user:bob"));
        let mut costly = rule("rl:per-user:alice");
        costly.cost = 20;
        overridden(&mut costly, table.find("rl:per-user:alice").unwrap());
        assert_eq!(
            costly.overridden.unwrap().burst,
            20,
            "the bucket holds one request's cost"
        );
    }
}
