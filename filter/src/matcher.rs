//! Which requests a rule applies to (`"match"`): path prefix, exact path, methods. Paths
//! are compared in normal form (`path::normalize`), so a pattern must be written in it.
//! Methods are compared as the upstream may serve the request: `HEAD` as the `GET` it is,
//! in any case, and as any method its override headers name (`method_override`).

use crate::config_error::{err, ConfigError};
use crate::path;
use crate::source::check_header_name;
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    path_prefix: Option<String>,
    path: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
}

/// Which requests a rule applies to; every present condition must hold. The paths are in
/// normal form (`path::normalize`), as the request paths they are compared with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Matcher {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    /// Upper-case method names; empty means any method.
    pub methods: Vec<String>,
}

/// The methods a request may be served as: its own, and each one its method-override
/// headers name (which of them the upstream honours is not known: any of them counts).
#[derive(Debug, Default)]
pub struct Methods<'r> {
    /// `:method`.
    pub own: &'r [u8],
    /// Every copy of each override header, each a comma-separated list of methods.
    pub overrides: Vec<&'r [u8]>,
}

impl Methods<'_> {
    /// Whether the request may be served as `method` (upper case): named so in any case,
    /// or `HEAD` for `GET` (RFC 9110 9.3.2: a GET whose content is not sent).
    fn include(&self, method: &str) -> bool {
        let named = |m: &[u8]| {
            let m = m.trim_ascii();
            m.eq_ignore_ascii_case(method.as_bytes())
                || (method == "GET" && m.eq_ignore_ascii_case(b"HEAD"))
        };
        named(self.own)
            || (self.overrides.iter()).any(|value| value.split(|&b| b == b',').any(named))
    }
}

impl Matcher {
    /// `path` is the request path in normal form (`path::normalize`), as the patterns are.
    pub fn matches(&self, methods: &Methods<'_>, path: &[u8]) -> bool {
        self.path_prefix
            .as_ref()
            .is_none_or(|p| path.starts_with(p.as_bytes()))
            && self.path.as_ref().is_none_or(|p| path == p.as_bytes())
            && (self.methods.is_empty() || self.methods.iter().any(|m| methods.include(m)))
    }
}

/// Most method-override headers (`method_override`).
pub const MAX_METHOD_OVERRIDES: usize = 8;

/// The `method_override` headers: valid names (lower-cased, as hosts deliver them), each
/// once, at most `MAX_METHOD_OVERRIDES`.
pub(crate) fn method_overrides(names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if names.len() > MAX_METHOD_OVERRIDES {
        return err(
            "method_override",
            format!("at most {MAX_METHOD_OVERRIDES} headers"),
        );
    }
    let mut headers: Vec<String> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let field = format!("method_override[{i}]");
        let header = check_header_name(&field, name)?;
        if headers.contains(&header) {
            return err(field, format!("{name:?} is listed twice"));
        }
        headers.push(header);
    }
    Ok(headers)
}

impl RawMatch {
    pub(crate) fn validate(self, field: &str) -> Result<Matcher, ConfigError> {
        for (name, value) in [("path_prefix", &self.path_prefix), ("path", &self.path)] {
            if let Some(p) = value {
                if !p.starts_with('/') {
                    return err(format!("{field}.{name}"), "must start with '/'");
                }
                // Refused, not rewritten: what the config says is exactly what is compared.
                let normal = path::normalize(p.as_bytes());
                if normal != p.as_bytes() {
                    return err(
                        format!("{field}.{name}"),
                        format!(
                            "{p:?} is not in the normal form requests are matched in; write {:?}",
                            String::from_utf8_lossy(&normal)
                        ),
                    );
                }
            }
        }
        let mut methods = Vec::with_capacity(self.methods.len());
        for (i, m) in self.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                return err(
                    format!("{field}.methods[{i}]"),
                    format!("{m:?} is not a method"),
                );
            }
            methods.push(m.to_ascii_uppercase());
        }
        Ok(Matcher {
            path_prefix: self.path_prefix,
            path: self.path,
            methods,
        })
    }
}

#[cfg(test)]
#[path = "matcher_tests.rs"]
mod tests;
