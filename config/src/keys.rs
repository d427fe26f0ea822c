//! Bucket keys, made in one place for the filter and the bridge: an identity value escaped
//! into the keys' alphabet (a header's, a JWT claim's, an address, or one an operator types
//! for `usage` and overrides), and the key of a rule's bucket for a client. Both sides must
//! name the same bucket for the same client, byte for byte, so neither makes keys its own
//! way; the grammar the keys keep is `ratelimit_protocol::key`, which the bridge holds
//! every check to.
//!
//! Escaping is what keeps hostile values from forging a key separator or a Redis Cluster
//! hash tag, and a digest what keeps a long value or key within the bridge's bound.

use crate::digest;
use crate::error::{err, ConfigError};
use ratelimit_protocol::key::{self, DIGEST_MARK, MAX_NAME_LEN, SEPARATOR};
use ratelimit_protocol::MAX_KEY_LEN;
use std::borrow::Cow;
use std::fmt::Write;

/// Longest escaped value kept verbatim in a key; longer ones become a digest.
pub use ratelimit_protocol::key::MAX_VALUE_LEN;

/// Length of a key whose identity values were replaced by their digest: `prefix:rule:#`
/// and 64 hex digits. It must fit the bridge's bound, whatever the names.
const DIGESTED_KEY_LEN: usize = MAX_NAME_LEN + 1 + MAX_NAME_LEN + 2 + 64;
const _: () = assert!(DIGESTED_KEY_LEN <= MAX_KEY_LEN);

/// The rule segment of every bucket key the bridge's rate limit service makes
/// (`prefix:rls:domain:key:value...`, in `ratelimit_bridge::doors::rls::lines`). Front
/// doors share one Redis and one key grammar, so each keeps to a namespace no other's
/// configuration can name: this name is the service's, and neither a gateway's rule
/// (`validate_rule_name`) nor a check on the gateways' wire (the bridge's keyspace) may use
/// it, or a client of a gateway could spend an RLS client's bucket. Exact: Redis keys are
/// case-sensitive, so `RLS` names other keys.
pub const SERVICE_RULE: &str = "rls";

/// A rule's name: a name (`validate_name`) that is not another front door's
/// (`SERVICE_RULE`).
pub(crate) fn validate_rule_name(field: &str, name: &str) -> Result<(), ConfigError> {
    validate_name(field, name)?;
    if name == SERVICE_RULE {
        return err(
            field,
            format!(
                "{name:?} is reserved: the bridge's rate limit service keys its buckets \
                 <key_prefix>:{SERVICE_RULE}:..., which a rule of that name would share"
            ),
        );
    }
    Ok(())
}

/// A name the configuration gives a key prefix, rule, identity or tier: names end up in
/// Redis keys and headers, so they keep to the keys' small, safe alphabet and length.
pub(crate) fn validate_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return err(field, format!("must be 1 to {MAX_NAME_LEN} characters"));
    }
    if !name.bytes().all(key::is_name_byte) {
        return err(
            field,
            format!("{name:?} may only hold letters, digits, '-', '_' and '.'"),
        );
    }
    Ok(())
}

/// A value as an operator types it (`alice`), made what a gateway makes of the same value
/// in a header or a JWT claim: trimmed, escaped, a digest when long; `None` when empty.
/// An address is typed as the gateway keys it (`198.51.100.4`, `2001:db8:1:2::/64`).
pub fn typed(value: &str) -> Option<String> {
    key_safe(value.trim_ascii().as_bytes()).map(Cow::into_owned)
}

/// `escape`d, borrowed when there is nothing to escape (the common case, on every
/// request's path); `None` when empty.
pub fn key_safe(bytes: &[u8]) -> Option<Cow<'_, str>> {
    if bytes.is_empty() {
        return None;
    }
    let verbatim = bytes.len() <= MAX_VALUE_LEN && bytes.iter().all(|&b| key::is_safe_byte(b));
    match std::str::from_utf8(bytes) {
        Ok(text) if verbatim => Some(Cow::Borrowed(text)),
        _ => Some(Cow::Owned(escape(bytes))),
    }
}

/// Percent-escapes everything but `[A-Za-z0-9._@+=!~-]`; values longer than
/// `MAX_VALUE_LEN` once escaped become `#` and the SHA-256 of the raw bytes in hex (`#` is
/// itself escaped, so a digest never equals a verbatim value): a value of `key`'s grammar.
pub fn escape(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_VALUE_LEN));
    for &b in raw {
        if key::is_safe_byte(b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        if out.len() > MAX_VALUE_LEN {
            return format!("{}{}", key::DIGEST_MARK, digest::sha256_hex(raw));
        }
    }
    out
}

/// The Redis key of the bucket of rule `rule` (under `prefix`) for a client whose identity
/// values, escaped as `escape` makes them, are `values` (one per identity of the rule's
/// key, in order): `prefix:rule[:value...]`. The one place keys are made: the filter's
/// planning, and the bridge's `usage` and overrides, which must name the same buckets. Its
/// keys are those of the grammar the bridge holds every check to (`ratelimit_protocol::key`).
///
/// Bounded by construction: past `MAX_KEY_LEN`, the values are replaced by `#` and the
/// SHA-256 of them all. Values are escaped and never hold `:` or `#`, so the joined values
/// are unambiguous and a digested key never equals a verbatim one (a rule's verbatim keys
/// have one component per identity; a rule of one identity never needs the digest).
pub fn bucket_key(
    prefix: &str,
    rule: &str,
    values: impl IntoIterator<Item = impl AsRef<str>>,
) -> String {
    let head = prefix.len() + 1 + rule.len();
    let mut key = String::with_capacity(head + 64);
    key.push_str(prefix);
    key.push(SEPARATOR);
    key.push_str(rule);
    for value in values {
        key.push(SEPARATOR);
        key.push_str(value.as_ref());
    }
    if key.len() <= MAX_KEY_LEN {
        return key;
    }
    let hex = digest::sha256_hex(key.as_bytes().get(head + 1..).unwrap_or_default());
    key.truncate(head);
    key.push(SEPARATOR);
    key.push(DIGEST_MARK);
    key.push_str(&hex);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_borrowed_verbatim_is_what_escaping_would_make_of_it() {
        let safe = "aZ09._@+=!~-";
        let cases = [
            safe.to_string(),
            "a".repeat(MAX_VALUE_LEN),
            "a".repeat(MAX_VALUE_LEN + 1),
            "a b".to_string(),
            "é".to_string(),
            "%41".to_string(),
        ];
        for case in cases {
            let made = key_safe(case.as_bytes()).unwrap();
            assert_eq!(made, escape(case.as_bytes()), "{case:?}");
            let borrowed = matches!(made, Cow::Borrowed(_));
            assert_eq!(borrowed, made == case, "copied only when changed: {case:?}");
        }
    }

    #[test]
    fn bucket_keys_are_made_in_one_place_and_bounded() {
        assert_eq!(bucket_key("rl", "global", &[] as &[&str]), "rl:global");
        assert_eq!(bucket_key("rl", "per-user", ["alice"]), "rl:per-user:alice");
        let long = [
            "x".repeat(128),
            "y".repeat(128),
            "z".repeat(128),
            "w".repeat(128),
        ];
        let key = bucket_key("rl", "four", &long);
        assert!(
            key.starts_with("rl:four:#") && key.len() == "rl:four:#".len() + 64,
            "{key}"
        );
        assert_eq!(
            key,
            bucket_key("rl", "four", &long),
            "the same values, the same key"
        );
    }

    #[test]
    fn the_rate_limit_services_rule_name_is_no_rule_of_a_gateway() {
        let refused = validate_rule_name("rules[0].name", SERVICE_RULE).unwrap_err();
        assert_eq!(refused.field, "rules[0].name");
        assert!(refused.problem.contains("reserved"), "{}", refused.problem);
        for other in ["RLS", "rls2", "rl", "r"] {
            assert!(validate_rule_name("f", other).is_ok(), "{other}");
        }
    }

    #[test]
    fn escaped_values_hold_no_separator_nor_hash_tag_and_long_ones_become_a_digest() {
        assert_eq!(escape(b"a:b{c}d,e f\n%"), "a%3Ab%7Bc%7Dd%2Ce%20f%0A%25");
        assert_eq!(escape(b"\xff\x00ok"), "%FF%00ok");
        let exact = "k".repeat(MAX_VALUE_LEN);
        assert_eq!(escape(exact.as_bytes()), exact);
        let long = escape(format!("{exact}k").as_bytes());
        assert!(long.starts_with('#') && long.len() == 65, "{long}");
        assert_eq!(typed(" a b "), Some("a%20b".into()));
        assert_eq!(typed("  "), None);
    }
}
