//! Which requests a rule applies to (`"match"`): path prefix, exact path, methods. Paths
//! are compared in normal form (`path::normalize`), so a pattern must be written in it.

use crate::config_error::{err, ConfigError};
use crate::path;
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

impl Matcher {
    /// `path` is the request path in normal form (`path::normalize`), as the patterns are.
    pub fn matches(&self, method: &[u8], path: &[u8]) -> bool {
        self.path_prefix
            .as_ref()
            .is_none_or(|p| path.starts_with(p.as_bytes()))
            && self.path.as_ref().is_none_or(|p| path == p.as_bytes())
            && (self.methods.is_empty() || self.methods.iter().any(|m| m.as_bytes() == method))
    }
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
