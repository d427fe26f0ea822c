//! Whether Redis's memory settings suit the buckets, told to the operator once. Every new
//! client makes a key (each fresh `x-user-id` one bucket per rule), so a Redis with
//! `maxmemory` fills up, and then its policy decides: `noeviction` refuses every write
//! (`OOM`), so every check fails, old clients' and new ones' alike, until keys expire;
//! `allkeys-*` may evict the overrides, which have no TTL so that `volatile-*` never does.
//! `volatile-ttl` evicts first the buckets closest to being full again (a bucket's TTL is
//! the time until it is), where evicting one, which makes it full, loses the least.

use crate::store::Store;

/// What `INFO memory` says of the limit and the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `maxmemory` in bytes; 0: no limit (Redis grows until the host runs out).
    pub maxmemory: u64,
    /// `maxmemory_policy`, e.g. `noeviction`, `volatile-ttl`.
    pub policy: String,
}

impl Settings {
    /// The two fields of an `INFO memory` answer; `None` if either is missing.
    pub fn parse(info: &str) -> Option<Settings> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        Some(Settings {
            maxmemory: field("maxmemory")?.parse().ok()?,
            policy: field("maxmemory_policy")?.to_string(),
        })
    }

    /// A warning for settings under which a flood of new clients fails every check or
    /// evicts an override; `None` when they suit (or nothing limits memory).
    pub fn warning(&self) -> Option<String> {
        let Settings { maxmemory, policy } = self;
        if *maxmemory == 0 {
            return None;
        }
        let why = if policy == "noeviction" {
            "once the buckets fill it every check fails (OOM), old clients' and new alike"
        } else if policy.starts_with("allkeys-") {
            "it may evict the overrides, which have no TTL so that volatile-ttl never does"
        } else {
            return None;
        };
        Some(format!(
            "redis has maxmemory {maxmemory} bytes with maxmemory-policy {policy}: {why}; \
             set maxmemory-policy volatile-ttl (see docs/operations.md, \"Redis memory\")"
        ))
    }
}

/// Reads the settings and logs their warning, unless it is `last` (said already), which
/// becomes the warning in force now; whether they were judged. An ACL without `+info`
/// (`NOPERM`) counts as judged: asking again would be refused again.
pub async fn judge(store: &Store, last: &mut Option<String>) -> bool {
    let info = match store.info("memory").await {
        Ok(info) => info,
        Err(e) => {
            log::debug!("cannot read INFO memory ({e}); the memory policy is not checked");
            return e.contains("NOPERM");
        }
    };
    let warning = Settings::parse(&info).and_then(|s| s.warning());
    if let Some(w) = warning.as_ref().filter(|w| last.as_ref() != Some(*w)) {
        log::warn!("{w}");
    }
    *last = warning;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(maxmemory: u64, policy: &str) -> Settings {
        Settings {
            maxmemory,
            policy: policy.into(),
        }
    }

    #[test]
    fn info_memory_is_read_by_field() {
        let info = "# Memory\r\nused_memory:1033712\r\nmaxmemory:4194304\r\n\
                    maxmemory_human:4.00M\r\nmaxmemory_policy:noeviction\r\n";
        assert_eq!(
            Settings::parse(info),
            Some(settings(4_194_304, "noeviction"))
        );
        assert_eq!(Settings::parse("# Memory\r\nused_memory:1\r\n"), None);
    }

    #[test]
    fn policies_that_fail_checks_or_evict_overrides_are_warned_about() {
        let warned = |m, p| settings(m, p).warning();
        assert!(warned(4 << 20, "noeviction")
            .unwrap()
            .contains("every check fails"));
        for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert!(warned(4 << 20, p).unwrap().contains("overrides"), "{p}");
        }
        for p in [
            "volatile-ttl",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
        ] {
            assert_eq!(warned(4 << 20, p), None, "{p}");
        }
        // Without maxmemory nothing is evicted or refused (the host runs out instead).
        assert_eq!(warned(0, "noeviction"), None);
    }
}
