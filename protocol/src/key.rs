//! The grammar of bucket keys, written once: the filter makes its keys in it (names checked
//! at load, identity values escaped to its alphabet), the bridge refuses every key outside
//! it. So whoever reaches the bridge can only name buckets a gateway could have named, never
//! the bridge's own records (`{overrides}`), a Cluster hash tag or a spelling no filter writes.
//!
//! ```text
//! key    = name ":" name *( ":" value )        ; prefix, rule, identity values
//! name   = 1*64( ALPHA / DIGIT / "." / "_" / "-" )
//! value  = 1*128( safe / "%" UPHEX UPHEX )     ; escaped; never the escape of a safe byte
//!        / "#" 64LOWHEX                        ; the SHA-256 of a long value, or of them all
//! safe   = ALPHA / DIGIT / "." / "_" / "@" / "+" / "=" / "!" / "~" / "-"
//! ```
//! and at most `MAX_KEY_LEN` bytes in all. A key whose values would pass that bound is
//! written `prefix:rule:#<digest>`, which the grammar already holds as one value.

use crate::bounds::MAX_KEY_LEN;
use crate::split;

/// Longest name: a key prefix, a rule (and, in the filter, an identity or a tier).
pub const MAX_NAME_LEN: usize = 64;
/// Longest value kept as it is, once escaped; a longer one is written as its digest.
pub const MAX_VALUE_LEN: usize = 128;
/// What starts a digest (a byte no escaped value holds).
pub const DIGEST_MARK: char = '#';
/// Hex digits of a digest (SHA-256).
pub const DIGEST_HEX_LEN: usize = 64;
/// What separates the key's segments.
pub const SEPARATOR: char = ':';

/// A byte of a name: `[A-Za-z0-9._-]`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._-".contains(&b)
}

/// Whether `name` is 1 to `MAX_NAME_LEN` name bytes.
pub fn is_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len()) && name.bytes().all(is_name_byte)
}

/// A byte a value carries as it is: `[A-Za-z0-9._@+=!~-]`; every other is `%XX`.
pub fn is_safe_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._@+=!~-".contains(&b)
}

/// A bucket key read by the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketKey<'a> {
    pub prefix: &'a str,
    pub rule: &'a str,
    /// The identity values as written, `:`-separated; empty for a rule of no identity.
    pub values: &'a str,
}

/// Reads `key` by the grammar; why it is no key the filter writes, if it is not.
pub fn parse_key(key: &str) -> Result<BucketKey<'_>, &'static str> {
    if key.len() > MAX_KEY_LEN {
        return Err("longer than a key can be");
    }
    let mut segments = split::split(key, SEPARATOR as u8);
    let (prefix, rule) = (segments.next(), segments.next());
    let (Some(prefix), Some(rule)) = (prefix, rule) else {
        return Err("no prefix:rule");
    };
    if !is_name(prefix) {
        return Err("the prefix is no name");
    }
    if !is_name(rule) {
        return Err("the rule is no name");
    }
    let values = segments.rest();
    if let Some(values) = values {
        if !split::split(values, SEPARATOR as u8).all(is_value) {
            return Err("a value is not as the filter escapes it");
        }
    }
    Ok(BucketKey {
        prefix,
        rule,
        values: values.unwrap_or_default(),
    })
}

/// Whether `value` is one identity value as the filter writes it.
pub fn is_value(value: &str) -> bool {
    match value.strip_prefix(DIGEST_MARK) {
        Some(hex) => {
            hex.len() == DIGEST_HEX_LEN
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        None => (1..=MAX_VALUE_LEN).contains(&value.len()) && is_escaped(value.as_bytes()),
    }
}

/// Safe bytes and `%XX` (upper-case hex) of bytes that are not safe.
fn is_escaped(mut bytes: &[u8]) -> bool {
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    while let Some((&b, rest)) = bytes.split_first() {
        bytes = match (b, rest) {
            (b'%', [high, low, rest @ ..]) => match (hex(*high), hex(*low)) {
                (Some(h), Some(l)) if !is_safe_byte(h << 4 | l) => rest,
                _ => return false,
            },
            (b, rest) if is_safe_byte(b) => rest,
            _ => return false,
        };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_the_filter_writes_are_read() {
        let digest = "0123456789abcdef".repeat(4);
        let read = parse_key("rl:per-user:alice").unwrap();
        assert_eq!(
            (read.prefix, read.rule, read.values),
            ("rl", "per-user", "alice")
        );
        assert_eq!(parse_key("edge:global").unwrap().values, "");
        for key in [
            "rl:r:a%3Ab%7B%FF%00".to_string(),
            "rl:r:2001%3Adb8%3A%3A%2F64:aZ09._@+=!~-".into(),
            format!("rl:r:#{digest}"),
            format!("rl:r:#{digest}:#{digest}:x"),
            format!("rl:r:{}", "v".repeat(MAX_VALUE_LEN)),
            format!("{}:{}", "p".repeat(64), "r".repeat(64)),
        ] {
            assert!(parse_key(&key).is_ok(), "{key}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let digest = "0123456789abcdef".repeat(4);
        for key in [
            "".to_string(),
            "rl".into(),
            "rl:".into(),
            ":r".into(),
            "rl:{overrides}".into(),
            "rl:{overrides}:r:alice".into(),
            "rl:r:".into(),
            "rl:r::a".into(),
            "rl:r:a:".into(),
            "rl:r:{a}".into(),
            "rl:r:a b".into(),
            "rl:r:%".into(),
            "rl:r:%4".into(),
            "rl:r:%zz".into(),
            "rl:r:%3a".into(),
            "rl:r:%41".into(),
            "rl:r:#".into(),
            format!("rl:r:#{}", &digest[1..]),
            format!("rl:r:#{digest}0"),
            format!("rl:r:#{}", digest.to_uppercase()),
            format!("rl:r:a#{digest}"),
            format!("rl:r:{}", "v".repeat(MAX_VALUE_LEN + 1)),
            format!("{}:r", "p".repeat(65)),
            format!("rl:r:{}", ["v"; 300].join(":")),
            "rl:r:é".into(),
        ] {
            assert!(parse_key(&key).is_err(), "{key}");
        }
    }

    #[test]
    fn every_byte_escaped_as_the_filter_does_is_a_value() {
        for b in 0..=255u8 {
            let value = match is_safe_byte(b) {
                true => char::from(b).to_string(),
                false => format!("%{b:02X}"),
            };
            assert!(is_value(&value), "{b}: {value}");
        }
    }
}
