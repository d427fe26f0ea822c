//! The admin endpoints, for operators: the overrides (`GET`, `PUT`, `DELETE
//! /admin/overrides`), the clients' plans (`GET`, `PUT`, `DELETE /admin/plans`), lifting a
//! block (`DELETE /admin/blocks`) and a client's usage (`GET /admin/usage`), the same
//! operations as the `override`, `plan`, `unblock` and `usage` commands,
//! with their flags as query parameters (`rule=`, `value=`; for the rate limit service's
//! buckets `domain=`, `entry=`). Changing a limit is more than checking one, so
//! they are served only to holders of the operators' secret (`--admin-token-file`), never
//! to the gateways' token (`401`), which every gateway holds: a bridge started without an
//! admin token file serves none of them (`404`), however reachable it is.

use crate::doors::guards::access::Access;
use crate::doors::rls::{operators, Rls};
use crate::doors::usage::{self, Query};
use crate::engine::overrides::registry;
use crate::engine::overrides::{parse_spec, Override, Target};
use crate::engine::plans::{self, Plan};
use crate::engine::unblock::unblock;
use crate::engine::Engine;
use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};
use ratelimit_config::config::Config;
use serde_json::Value;

/// Where the admin endpoints live.
pub const PREFIX: &str = "/admin/";

/// An answer: status and body (JSON on success, a sentence otherwise).
pub type Answer = (StatusCode, String);

/// What the admin endpoints may use.
pub struct Admin<'a> {
    /// The store the overrides and blocks are in, and the regions, for a global rule's
    /// ledger in usage (`--region`).
    pub engine: &'a Engine,
    /// The operators' secret; open (no `--admin-token-file`): no admin endpoint is served.
    pub access: &'a Access,
    /// The plugin configuration, for usage (`--config`).
    pub plugin: Option<&'a Config>,
    /// The rate limit service, for its descriptors' usage (`--rls-config`).
    pub rls: Option<&'a Rls>,
}

impl Admin<'_> {
    /// Answers `method path?query` with `headers`.
    pub async fn answer(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        headers: &HeaderMap,
    ) -> Answer {
        if self.access.is_open() {
            return (
                StatusCode::NOT_FOUND,
                "the admin endpoints need the bridge's --admin-token-file\n".into(),
            );
        }
        if !self.access.admits(headers) {
            return (StatusCode::UNAUTHORIZED, "unauthorized\n".into());
        }
        let params = Params::parse(query);
        let result = match (method, path) {
            (&Method::GET, "/admin/overrides") => self.list(&params).await,
            (&Method::PUT, "/admin/overrides") => self.set(&params).await,
            (&Method::DELETE, "/admin/overrides") => self.clear(&params).await,
            (&Method::GET, "/admin/usage") => self.usage(&params).await,
            (&Method::DELETE, "/admin/blocks") => self.unblock(&params).await,
            (&Method::GET, "/admin/plans") => self.plans(&params).await,
            (&Method::PUT, "/admin/plans") => self.set_plan(&params).await,
            (&Method::DELETE, "/admin/plans") => self.clear_plan(&params).await,
            (_, "/admin/overrides" | "/admin/usage" | "/admin/blocks" | "/admin/plans") => {
                return (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed\n".into(),
                )
            }
            _ => return (StatusCode::NOT_FOUND, "not found\n".into()),
        };
        match result {
            Ok(json) => (StatusCode::OK, format!("{json}\n")),
            Err(Failure::Bad(why)) => (StatusCode::BAD_REQUEST, format!("{why}\n")),
            Err(Failure::Redis(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }

    /// `prefix=` (default: the bridge's first key prefix), which must be one of its own.
    fn prefix<'p>(&'p self, params: &'p Params) -> Result<&'p str, Failure> {
        let mut own = self.engine.store().keyspace().prefixes();
        match params.one("prefix") {
            None => own.next().ok_or(Failure::Bad("no key prefix".into())),
            Some(p) if own.any(|o| o == p) => Ok(p),
            Some(p) => Err(Failure::Bad(format!(
                "prefix {p:?} is not one of the bridge's --key-prefix"
            ))),
        }
    }

    /// `rule=` and `value=`s (a plugin rule's), or `domain=` and `entry=`s (the rate limit
    /// service's), as the commands' flags.
    fn target(&self, params: &Params) -> Result<Target, Failure> {
        let prefix = self.prefix(params)?;
        let target = match params.one("domain") {
            Some(domain) => operators::target(prefix, domain, &params.all("entry")),
            None => Target::new(prefix, params.required("rule")?, &params.all("value")),
        };
        target.map_err(Failure::Bad)
    }

    async fn list(&self, params: &Params) -> Result<Value, Failure> {
        let active = registry::list(self.engine.store(), self.prefix(params)?).await;
        Ok(active
            .map_err(Failure::Redis)?
            .iter()
            .map(Override::to_json)
            .collect())
    }

    async fn set(&self, params: &Params) -> Result<Value, Failure> {
        let target = self.target(params)?;
        let (limit, ttl_ms) = parse_spec(
            params
                .number("requests")?
                .ok_or(Failure::Bad("missing requests=".into()))?,
            params.required("per")?,
            params.number("burst")?,
            params.required("ttl")?,
        )
        .map_err(Failure::Bad)?;
        let set = registry::set(self.engine.store(), target, limit, ttl_ms).await;
        Ok(set.map_err(Failure::Redis)?.to_json())
    }

    async fn clear(&self, params: &Params) -> Result<Value, Failure> {
        let target = self.target(params)?;
        let cleared = registry::clear(self.engine.store(), &target).await;
        Ok(serde_json::json!({"key": target.key, "cleared": cleared.map_err(Failure::Redis)?}))
    }

    async fn plans(&self, params: &Params) -> Result<Value, Failure> {
        let listed = plans::registry::list(self.engine.store(), self.prefix(params)?).await;
        let (_, all) = listed.map_err(Failure::Redis)?;
        Ok(all.iter().map(Plan::to_json).collect())
    }

    /// A client's plan (`rule=`, `value=`s, `plan=`, `requests=`, `per=`, `burst=`), as
    /// `plan set`.
    async fn set_plan(&self, params: &Params) -> Result<Value, Failure> {
        let target = self.plan_target(params)?;
        let plan = Plan::new(
            target,
            params.required("plan")?,
            params
                .number("requests")?
                .ok_or(Failure::Bad("missing requests=".into()))?,
            params.required("per")?,
            params.number("burst")?,
        )
        .map_err(Failure::Bad)?;
        let set = plans::registry::set(self.engine.store(), std::slice::from_ref(&plan)).await;
        set.map_err(Failure::Redis)?;
        Ok(plan.to_json())
    }

    async fn clear_plan(&self, params: &Params) -> Result<Value, Failure> {
        let target = self.plan_target(params)?;
        let cleared = plans::registry::clear(self.engine.store(), std::slice::from_ref(&target));
        let cleared = cleared.await.map_err(Failure::Redis)? > 0;
        Ok(serde_json::json!({"key": target.key, "cleared": cleared}))
    }

    /// A plugin rule's client: plans are not the rate limit service's.
    fn plan_target(&self, params: &Params) -> Result<Target, Failure> {
        if params.one("domain").is_some() {
            return Err(Failure::Bad("plans name a plugin rule's clients".into()));
        }
        self.target(params)
    }

    async fn unblock(&self, params: &Params) -> Result<Value, Failure> {
        if params.one("domain").is_some() {
            return Err(Failure::Bad(
                "the rate limit service's limits have no block to lift".into(),
            ));
        }
        let target = self.target(params)?;
        let unblocked = unblock(self.engine.store(), &target).await;
        Ok(serde_json::json!({"key": target.key, "unblocked": unblocked.map_err(Failure::Redis)?}))
    }

    async fn usage(&self, params: &Params) -> Result<Value, Failure> {
        if let Some(domain) = params.one("domain") {
            let Some(rls) = self.rls else {
                return Err(Failure::Bad(
                    "usage of a domain needs the bridge started with --rls-config".into(),
                ));
            };
            let (prefix, rule, spec) =
                (rls.usage_bucket(domain, &params.all("entry"))).map_err(Failure::Bad)?;
            return usage::read(self.engine, &prefix, &rule, spec)
                .await
                .map_err(Failure::Redis);
        }
        let Some(plugin) = self.plugin else {
            return Err(Failure::Bad(
                "usage needs the bridge started with --config PLUGIN.json".into(),
            ));
        };
        let query = Query {
            rule: params.required("rule")?.into(),
            values: params.all("value"),
            tier: params.one("tier").map(str::to_string),
        };
        let (rule, spec) = usage::bucket(plugin, &query).map_err(Failure::Bad)?;
        usage::read(self.engine, &plugin.key_prefix, &rule, spec)
            .await
            .map_err(Failure::Redis)
    }
}

/// Why an admin call failed: the caller's request (`400`) or Redis (`503`).
enum Failure {
    Bad(String),
    Redis(String),
}

/// A query string's parameters, percent-decoded (`+` is a space), in order.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: &str) -> Params {
        Params(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    fn one(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The number `name=`, if given.
    fn number(&self, name: &str) -> Result<Option<u64>, Failure> {
        self.one(name)
            .map(|n| {
                n.parse()
                    .map_err(|_| Failure::Bad(format!("{name}: {n:?} is not a number")))
            })
            .transpose()
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.one(name)
            .ok_or_else(|| Failure::Bad(format!("missing query parameter {name:?}")))
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// `%XX` escapes decoded and `+` as a space; a malformed escape stays as written.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded_and_repeatable() {
        let params = Params::parse("rule=per-user&value=al%20ice&value=a+b&value=%zz&empty");
        assert_eq!(params.one("rule"), Some("per-user"));
        assert_eq!(params.all("value"), ["al ice", "a b", "%zz"]);
        assert_eq!(params.one("empty"), Some(""));
        assert!(params.required("ttl").is_err());
        assert_eq!(decode("%7Boverrides%7d"), "{overrides}");
    }
}
