//! Which of Higress's `matchRules` entries (`_rules_`, `ratelimit_config::scope`) a
//! request falls in: the first whose routes or domains match it (Higress's precedence),
//! else none and the top-level rules apply.

use crate::host::RequestView;
use ratelimit_config::scope::{Domain, Scope};
use std::cell::OnceCell;

/// Whether `host` (without its port) matches `domain`, compared without regard to case.
fn domain_matches(domain: &Domain, host: &[u8]) -> bool {
    match domain {
        Domain::Exact(d) => host.eq_ignore_ascii_case(d.as_bytes()),
        Domain::Suffix(s) => {
            host.len() >= s.len() && host[host.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
        }
        Domain::Prefix(p) => {
            host.len() >= p.len() && host[..p.len()].eq_ignore_ascii_case(p.as_bytes())
        }
    }
}

/// `authority` without its port: `a.example.com:8080` → `a.example.com`, `[::1]:80` →
/// `[::1]`.
fn host_of(authority: &[u8]) -> &[u8] {
    let port_at = match authority.iter().rposition(|&b| b == b':') {
        Some(colon) if !authority[colon..].contains(&b']') => colon,
        _ => authority.len(),
    };
    &authority[..port_at]
}

/// The first of `scopes` the request falls in, by index; `None`: the top-level rules.
/// The route name and the host are each read once, and only when some entry needs them.
pub fn of_request(scopes: &[Scope], req: &impl RequestView) -> Option<usize> {
    let route = OnceCell::new();
    let host = OnceCell::new();
    let route = || route.get_or_init(|| req.route_name()).as_deref();
    let host = || *host.get_or_init(|| req.header(":authority").map(host_of));
    scopes.iter().position(|scope| match scope {
        Scope::Routes(names) => route().is_some_and(|r| names.iter().any(|n| n.as_bytes() == r)),
        Scope::RoutePrefixes(prefixes) => {
            route().is_some_and(|r| prefixes.iter().any(|p| r.starts_with(p.as_bytes())))
        }
        Scope::Domains(domains) => {
            host().is_some_and(|h| domains.iter().any(|d| domain_matches(d, h)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{FakeRequest, ROUTE_READ};
    use ratelimit_config::config::Config;

    /// The scopes of a configuration whose `_rules_` entries match as `entries` say.
    fn scopes(entries: &[&str]) -> Vec<Scope> {
        let rule = r#"[{"name": "r", "limit": {"requests": 1, "per": "1s"}}]"#;
        let entries: Vec<String> = (entries.iter().enumerate())
            .map(|(i, m)| format!(r#"{{{m}, "rules": [{{"name": "r{i}", "limit": {{"requests": 1, "per": "1s"}}}}]}}"#))
            .collect();
        let json = format!(
            r#"{{"backend": {{"cluster": "b"}}, "rules": {rule}, "_rules_": [{}]}}"#,
            entries.join(", ")
        );
        Config::parse(json.as_bytes()).unwrap().scopes
    }

    #[test]
    fn the_first_matching_entry_wins_and_hosts_are_compared_without_port_or_case() {
        let scopes = scopes(&[
            r#""_match_domain_": ["*.example.com", "api.*"]"#,
            r#""_match_route_": ["orders"]"#,
            r#""_match_route_prefix_": ["ord"]"#,
            r#""_match_domain_": ["Exact.Test"]"#,
        ]);
        let on = |authority: &str, route: Option<&str>| {
            let mut req = FakeRequest::default().with(":authority", authority);
            req.route = route.map(|r| r.as_bytes().to_vec());
            of_request(&scopes, &req)
        };
        assert_eq!(on("A.Example.COM:8443", Some("orders")), Some(0));
        assert_eq!(on("api.internal", None), Some(0));
        assert_eq!(
            on("example.com", Some("orders")),
            Some(1),
            "*.x needs a subdomain"
        );
        assert_eq!(on("other", Some("ordinals")), Some(2));
        assert_eq!(on("exact.test:80", None), Some(3));
        assert_eq!(on("[::1]:80", Some("none")), None);
        let req = FakeRequest::default().with(":authority", "nowhere");
        assert_eq!(of_request(&scopes, &req), None);
        // Two domain entries and two route entries, none matching: each name read once.
        assert_eq!(*req.reads.borrow(), [":authority", ROUTE_READ]);
        assert_eq!(on("exact.test.evil", None), None);
    }
}
