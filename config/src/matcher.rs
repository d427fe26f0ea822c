//! A rule's `match` (path prefix, exact path, methods) and the `method_override` headers,
//! as the configuration may write them. A path pattern must be in the normal form request
//! paths are compared in (`path::normalize`): refused otherwise, not rewritten, so that
//! what the configuration says is exactly what is compared. Comparing a request with them
//! is the filter's (`matcher`).

use crate::error::{err, ConfigError};
use crate::path;
use crate::source::validate_header_name;
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
        let header = validate_header_name(&field, name)?;
        if headers.contains(&header) {
            return err(field, format!("{name:?} is listed twice"));
        }
        headers.push(header);
    }
    Ok(headers)
}

/// Refuses a configured path (`field`) that is not in the normal form requests are compared
/// in: refused, not rewritten, so that what the config says is exactly what is compared.
pub(crate) fn normal_path(field: &str, p: &str) -> Result<(), ConfigError> {
    if !p.starts_with('/') {
        return err(field, "must start with '/'");
    }
    let normal = path::normalize(p.as_bytes());
    if normal != p.as_bytes() {
        return err(
            field,
            format!(
                "{p:?} is not in the normal form requests are matched in; write {:?}",
                String::from_utf8_lossy(&normal)
            ),
        );
    }
    Ok(())
}

impl RawMatch {
    pub(crate) fn validate(self, field: &str) -> Result<Matcher, ConfigError> {
        for (name, value) in [("path_prefix", &self.path_prefix), ("path", &self.path)] {
            if let Some(p) = value {
                normal_path(&format!("{field}.{name}"), p)?;
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
mod tests {
    use crate::config::Config;

    #[test]
    fn method_override_names_are_checked_at_load() {
        let rule = r#""rules": [{"name": "r", "limit": {"requests": 1, "per": "1s"}}]"#;
        let refused = |value: &str| {
            let json =
                format!(r#"{{"backend": {{"cluster": "b"}}, {rule}, "method_override": {value}}}"#);
            Config::parse(json.as_bytes())
                .err()
                .map(|e| (e.field, e.problem))
        };
        let at = |value: &str| refused(value).map(|(field, _)| field);
        assert_eq!(
            at(r#"["x-a", "x b"]"#).as_deref(),
            Some("method_override[1]")
        );
        assert_eq!(at(r#"[":method"]"#).as_deref(), Some("method_override[0]"));
        assert_eq!(
            at(r#"["X-A", "x-a"]"#).as_deref(),
            Some("method_override[1]")
        );
        let nine = format!("[{}]", ["\"h\""; 9].join(","));
        assert_eq!(at(&nine).as_deref(), Some("method_override"));
        assert_eq!(
            refused(r#"["x-a", "x-a"]"#)
                .map(|(_, problem)| problem)
                .as_deref(),
            Some("\"x-a\" is listed twice")
        );
        assert_eq!(
            refused(r#"["x y"]"#).map(|(_, problem)| problem).as_deref(),
            Some("\"x y\" is not a valid header name")
        );
        assert_eq!(refused("[]"), None);
    }
}
