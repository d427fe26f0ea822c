//! Higress's `matchRules`: Higress hands them to a plugin as `_rules_`, entries that give
//! routes or domains a configuration of their own. Here an entry gives them rules of their
//! own: a request on a matching route or domain is limited by the first matching entry's
//! `rules` instead of the top-level ones (Higress's precedence: the first entry that
//! matches, else the global configuration). Everything else (backend, identities, failure
//! mode) is the worker's, shared by all entries.
//!
//! Here is what an entry may say; which entry a request falls in is the filter's (`scope`).

use crate::error::{err, ConfigError};
use serde::Deserialize;

/// Most `_rules_` entries.
pub const MAX_SCOPES: usize = 64;
/// Most routes or domains one entry names.
const MAX_NAMES: usize = 256;
/// Longest route name or domain pattern.
const MAX_NAME_LEN: usize = 256;

/// One `_rules_` entry as Higress writes it: what it matches, and its rules (kept raw: the
/// configuration validates them with its identities).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScope<R> {
    #[serde(default, rename = "_match_route_")]
    routes: Vec<String>,
    #[serde(default, rename = "_match_route_prefix_")]
    route_prefixes: Vec<String>,
    #[serde(default, rename = "_match_domain_")]
    domains: Vec<String>,
    pub(crate) rules: Vec<R>,
}

/// What an entry matches: exactly one kind of name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Envoy's `route_name` property is one of these.
    Routes(Vec<String>),
    /// `route_name` starts with one of these.
    RoutePrefixes(Vec<String>),
    /// The request's host (`:authority` without its port) matches one of these.
    Domains(Vec<Domain>),
}

/// A domain pattern: `api.example.com`, `*.example.com` (any host ending `.example.com`) or
/// `api.*` (any host starting `api.`), compared without regard to case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Domain {
    Exact(String),
    Suffix(String),
    Prefix(String),
}

impl<R> RawScope<R> {
    /// The entry's scope; its rules are the caller's to validate.
    pub(crate) fn scope(&self, field: &str) -> Result<Scope, ConfigError> {
        let kinds = [
            ("_match_route_", &self.routes),
            ("_match_route_prefix_", &self.route_prefixes),
            ("_match_domain_", &self.domains),
        ];
        let mut given = kinds.iter().filter(|(_, names)| !names.is_empty());
        let Some(&(kind, names)) = given.next() else {
            return err(
                field,
                "needs one of _match_route_, _match_route_prefix_ or _match_domain_",
            );
        };
        if let Some((other, _)) = given.next() {
            return err(field, format!("has both {kind} and {other}: one per entry"));
        }
        if names.len() > MAX_NAMES {
            return err(
                format!("{field}.{kind}"),
                format!("at most {MAX_NAMES} names"),
            );
        }
        for (i, name) in names.iter().enumerate() {
            if name.is_empty()
                || name.chars().count() > MAX_NAME_LEN
                || name.chars().any(char::is_control)
            {
                return err(
                    format!("{field}.{kind}[{i}]"),
                    format!("must be 1 to {MAX_NAME_LEN} characters, none a control character"),
                );
            }
        }
        Ok(match kind {
            "_match_route_" => Scope::Routes(names.clone()),
            "_match_route_prefix_" => Scope::RoutePrefixes(names.clone()),
            _ => Scope::Domains(names.iter().map(|d| Domain::parse(d)).collect()),
        })
    }
}

impl Domain {
    fn parse(pattern: &str) -> Domain {
        let pattern = pattern.to_ascii_lowercase();
        match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
            (Some(suffix), _) => Domain::Suffix(suffix.to_owned()),
            (None, Some(prefix)) => Domain::Prefix(prefix.to_owned()),
            (None, None) => Domain::Exact(pattern),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(json: &str) -> Result<Scope, ConfigError> {
        let raw: RawScope<serde_json::Value> = serde_json::from_str(json).unwrap();
        raw.scope("_rules_[0]")
    }

    #[test]
    fn an_entry_matches_one_kind_of_name() {
        assert_eq!(
            scope(r#"{"_match_route_": ["default/foo"], "rules": []}"#),
            Ok(Scope::Routes(vec!["default/foo".into()]))
        );
        let problems = [
            r#"{"rules": []}"#,
            r#"{"_match_route_": [], "rules": []}"#,
            r#"{"_match_route_": ["a"], "_match_domain_": ["b"], "rules": []}"#,
            r#"{"_match_domain_": [""], "rules": []}"#,
            r#"{"_match_domain_": ["a\nb"], "rules": []}"#,
        ];
        for json in problems {
            assert!(scope(json).is_err(), "{json}");
        }
    }

    #[test]
    fn domain_patterns_are_read_lower_case_with_their_wildcard_at_either_end() {
        let json = r#"{"_match_domain_": ["*.Example.com", "api.*", "Exact.Test"], "rules": []}"#;
        assert_eq!(
            scope(json),
            Ok(Scope::Domains(vec![
                Domain::Suffix(".example.com".into()),
                Domain::Prefix("api.".into()),
                Domain::Exact("exact.test".into()),
            ]))
        );
    }
}
