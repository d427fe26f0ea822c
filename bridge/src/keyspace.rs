//! Which Redis keys the bridge may touch: only those under its configured prefixes
//! (`--key-prefix`, default `rl`). Whoever reaches the bridge can name any key in a check;
//! without this bound a caller could overwrite or expire any key of a shared Redis
//! (sessions, queues), not only rate-limit buckets.

use crate::check::Check;

/// The default prefix, the filter's default `key_prefix`.
pub const DEFAULT_PREFIX: &str = "rl";

/// The prefixes whose keys (`prefix:...`) the bridge may read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    /// Each prefix with its `:` separator.
    prefixes: Vec<String>,
}

impl Default for Keyspace {
    fn default() -> Keyspace {
        Keyspace {
            prefixes: vec![format!("{DEFAULT_PREFIX}:")],
        }
    }
}

/// Whether `name` is 1 to 64 of `[A-Za-z0-9._-]`: what the filter allows in its
/// `key_prefix` and rule names.
pub fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Keyspace {
    /// Parses a comma-separated list of prefixes, each 1 to 64 of `[A-Za-z0-9._-]` (the
    /// characters the filter allows in its `key_prefix`).
    pub fn parse(list: &str) -> Result<Keyspace, String> {
        let mut prefixes = Vec::new();
        for prefix in list.split(',').map(str::trim) {
            let valid = is_name(prefix);
            if !valid {
                return Err(format!(
                    "{prefix:?} is not a key prefix (1 to 64 letters, digits, '.', '_' or '-')"
                ));
            }
            prefixes.push(format!("{prefix}:"));
        }
        Ok(Keyspace { prefixes })
    }

    /// The prefixes, without their `:`.
    pub fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.prefixes
            .iter()
            .map(|p| p.strip_suffix(':').unwrap_or(p))
    }

    /// Why `check` may not run, if one of its keys lies outside every prefix.
    pub fn refusal(&self, check: &Check) -> Option<String> {
        let outside = check.iter().find(|rule| {
            !self
                .prefixes
                .iter()
                .any(|p| rule.key.starts_with(p.as_str()))
        })?;
        Some(format!(
            "key {:?} is outside the bridge's key prefixes",
            outside.key.chars().take(64).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::RuleSpec;

    fn check(keys: &[&str]) -> Check {
        keys.iter()
            .map(|&key| RuleSpec::plain(key, 1, 1, 1, 1))
            .collect()
    }

    #[test]
    fn only_keys_under_a_prefix_are_admitted() {
        let keys = Keyspace::parse("rl, edge").unwrap();
        assert_eq!(keys.refusal(&check(&["rl:a", "edge:b:c"])), None);
        for bad in ["session:42", "rl", "rlx:a", "edg:a", "RL:a", ":rl:a"] {
            let refusal = keys.refusal(&check(&["rl:ok", bad]));
            assert!(refusal.is_some_and(|r| r.contains(bad)), "{bad}");
        }
        assert_eq!(Keyspace::default(), Keyspace::parse("rl").unwrap());
    }

    #[test]
    fn bad_prefixes_are_refused() {
        for bad in ["", "rl,", "a:b", "a b", "{rl}", &"p".repeat(65)] {
            assert!(Keyspace::parse(bad).is_err(), "{bad:?}");
        }
    }
}
