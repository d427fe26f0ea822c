//! Whether a rule's `match` covers a request. Paths are compared in normal form
//! (`ratelimit_config::path::normalize`), the form the configuration's patterns are
//! checked to be in at load. Methods are compared as the upstream may serve the request:
//! `HEAD` as the `GET` it is, in any case, and as any method its override headers name
//! (`method_override`).

use ratelimit_config::matcher::Matcher;

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

/// Whether `matcher` covers a request served as `methods` on `path`, the request path in
/// normal form, as the patterns are. Every condition the matcher has must hold.
pub fn matches(matcher: &Matcher, methods: &Methods<'_>, path: &[u8]) -> bool {
    matcher
        .path_prefix
        .as_ref()
        .is_none_or(|p| path.starts_with(p.as_bytes()))
        && matcher.path.as_ref().is_none_or(|p| path == p.as_bytes())
        && (matcher.methods.is_empty() || matcher.methods.iter().any(|m| methods.include(m)))
}

#[cfg(test)]
#[path = "matcher_tests.rs"]
mod tests;
