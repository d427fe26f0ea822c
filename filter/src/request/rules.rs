//! Which rules apply to a request, and the bucket each of them checks (its key made by
//! `ratelimit_config::keys::bucket_key`, as the bridge makes it).

use crate::host::RequestView;
use crate::request::identity::{self, BadIdentity, Place, Problem};
use crate::request::matcher::{self, Methods};
use crate::request::scope;
use ratelimit_config::config::Config;
use ratelimit_config::keys::bucket_key;
use ratelimit_config::limit::Limit;
use ratelimit_config::meter::MeterPolicy;
use ratelimit_config::path;
use ratelimit_config::source::{Missing, Source};
use ratelimit_protocol::slot::Slot;
use ratelimit_protocol::{Block, RuleSpecRef};
use std::borrow::Cow;

/// One bucket to check for the current request: a planned rule. On the wire it is a
/// `RuleSpecRef` (`spec_ref`), the rule and the limit it is checked under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRule {
    /// Index of the rule in `Config::rules`.
    pub rule: usize,
    /// The bucket's Redis key: `prefix:rule[:identity values]`, or `prefix:rule:#digest`
    /// when the values would make it longer than the bridge accepts.
    pub key: String,
    /// The limit in force for this client (its tier's, if it has one).
    pub limit: Limit,
    pub cost: u64,
    /// Tokens this check asks for beyond the cost, as a lease (0: none; see `lease`).
    pub lease: u64,
    /// When the rule blocks repeat offenders (never in shadow mode).
    pub block: Option<Block>,
    /// The rule is in shadow mode: it never denies.
    pub shadow: bool,
    /// An in-flight rule's slot for this request (its id given when the check is asked).
    pub slot: Option<Slot>,
}

impl PlannedRule {
    /// This rule as its check's line carries it (`wire::encode_check`), under `config`
    /// (whose rule it is): the same borrowed form a parsed `RuleSpec` gives, so one encoder
    /// serves both.
    pub fn spec_ref<'a>(&'a self, config: &'a Config) -> RuleSpecRef<'a> {
        let rule = config.rules.get(self.rule);
        RuleSpecRef {
            key: &self.key,
            burst: self.limit.burst,
            num: self.limit.num,
            den: self.limit.den,
            cost: self.cost,
            lease: self.lease,
            block: self.block,
            shadow: self.shadow,
            settle: None,
            global: rule.and_then(|r| r.global.as_ref()),
            slot: self.slot.as_ref(),
            calendar: rule.and_then(|r| r.calendar(&self.limit)),
        }
    }
}

/// Why a request is refused before any check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplanned {
    /// It carries an identity whose value cannot be told.
    Bad(BadIdentity),
    /// It lacks `identity` (an index into `Config::identities`), which the key of `rule`
    /// needs, and the rule refuses such requests (`"missing": "deny"`).
    Missing { rule: usize, identity: usize },
    /// A rule that applies is keyed on a field of the body, which has not been read: plan
    /// again once it has, with its `BodyValues`.
    AwaitsBody,
}

/// What the request's body held at each body identity's field, by identity index (other
/// identities: absent), once it has been read (`identity::body_value`).
pub type BodyValues = [Result<Option<String>, Problem>];

impl From<BadIdentity> for Unplanned {
    fn from(bad: BadIdentity) -> Unplanned {
        Unplanned::Bad(bad)
    }
}

/// Every rule that applies to the request and whose identities it carries, in config order;
/// or why the request is refused: an identity it carries that cannot be told, or one it
/// lacks that a rule will not do without. A rule in shadow mode never refuses: the index of
/// each that would have is handed to `shadow_missing`. `body`: the body identities' values,
/// once the body has been read; until then a rule keyed on one makes it `AwaitsBody`.
pub fn plan<'r>(
    config: &Config,
    req: &'r impl RequestView,
    body: Option<&'r BodyValues>,
    mut shadow_missing: impl FnMut(usize),
) -> Result<Vec<PlannedRule>, Unplanned> {
    // Reading :method (and the method overrides) and :path costs scans of the headers and a
    // normalization (with an allocation): only when some rule matches on them.
    let (methods, path) = match config.matches_requests {
        true => {
            let read = |name| req.header(name).unwrap_or_default();
            let mut methods = Methods {
                own: read(":method"),
                overrides: Vec::new(),
            };
            for name in &config.method_override {
                methods.overrides.extend(req.header_list(name));
            }
            (methods, path::normalize(read(":path")))
        }
        false => (Methods::default(), Vec::new()),
    };
    // Identities are resolved at most once per request, and only when a rule needs them.
    let mut values: Vec<Option<Option<Cow<str>>>> = vec![None; config.identities.len()];
    let scope = scope_of(config, req);
    let mut planned = Vec::new();
    for (index, rule) in config.rules.iter().enumerate() {
        if rule.scope != scope || !matcher::matches(&rule.matcher, &methods, &path) {
            continue;
        }
        resolve(config, req, body, &mut values, &rule.key)?;
        let value_of = |id: usize| values.get(id)?.as_ref()?.as_deref();
        let mut absent =
            (rule.key.iter().zip(&rule.missing)).filter(|(&id, _)| value_of(id).is_none());
        if let Some((&identity, _)) = absent.clone().find(|(_, &m)| m == Missing::Deny) {
            match rule.shadow {
                true => shadow_missing(index),
                false => {
                    return Err(Unplanned::Missing {
                        rule: index,
                        identity,
                    })
                }
            }
        }
        if absent.next().is_some() {
            continue;
        }
        planned.push(planned_rule(config, req, body, &mut values, index)?);
    }
    Ok(planned)
}

/// What a client may read of its own quota (`quota_api`): every rule, whatever it matches,
/// that it has every identity of the key of, but those already `charged` to its request, in
/// shadow mode, global, or keyed on its body (a quota request has none), each as a look: a
/// shadow rule of cost 0, which takes nothing and says what is left.
pub fn looks(config: &Config, req: &impl RequestView, charged: &[PlannedRule]) -> Vec<PlannedRule> {
    let mut values: Vec<Option<Option<Cow<str>>>> = vec![None; config.identities.len()];
    let scope = scope_of(config, req);
    let mut looks = Vec::new();
    for (index, rule) in config.rules.iter().enumerate() {
        let skipped = rule.scope != scope
            || rule.shadow
            || rule.global.is_some()
            || charged.iter().any(|p| p.rule == index);
        if skipped || resolve(config, req, None, &mut values, &rule.key).is_err() {
            continue;
        }
        if rule
            .key
            .iter()
            .any(|&id| !matches!(values.get(id), Some(Some(Some(_)))))
        {
            continue;
        }
        if let Ok(planned) = planned_rule(config, req, None, &mut values, index) {
            looks.push(PlannedRule {
                cost: 0,
                block: None,
                shadow: true,
                slot: planned.slot.map(|s| Slot {
                    id: LOOK_ID.into(),
                    ..s
                }),
                ..planned
            });
        }
    }
    looks
}

/// The `_rules_` entry whose rules `req` takes (`None`: the top-level rules).
fn scope_of(config: &Config, req: &impl RequestView) -> Option<usize> {
    match config.scopes.is_empty() {
        true => None,
        false => scope::of_request(&config.scopes, req),
    }
}

/// The slot id of a look at an in-flight rule: never a request's (theirs are a worker's
/// prefix and a counter), and a look takes no slot anyway.
pub const LOOK_ID: &str = "look";

/// Rule `index`, which applies to `req` and whose key's identities are resolved in
/// `values`, planned: its key, its tier's limit, what one request costs.
fn planned_rule<'r>(
    config: &Config,
    req: &'r impl RequestView,
    body: Option<&'r BodyValues>,
    values: &mut [Option<Option<Cow<'r, str>>>],
    index: usize,
) -> Result<PlannedRule, Unplanned> {
    let Some(rule) = config.rules.get(index) else {
        return Err(Unplanned::AwaitsBody); // never: `index` is one of config's rules
    };
    resolve(config, req, body, values, rule.tier_identity.as_slice())?;
    let value_of = |id: usize| values.get(id)?.as_ref()?.as_deref();
    let key_values = rule.key.iter().filter_map(|&id| value_of(id));
    Ok(PlannedRule {
        rule: index,
        key: bucket_key(&config.key_prefix, &rule.name, key_values),
        limit: rule.limit_for(rule.tier_identity.and_then(value_of)),
        // A reservation read from the body is known once the body has ended; until
        // then, the least it can be (what the deny cache may refuse a request for).
        cost: rule
            .meter
            .as_ref()
            .map_or(rule.cost, |m| match m.reserve_body.is_empty() {
                true => reservation(m, req, Asked::Nothing),
                false => reservation(m, req, Asked::Count(1)),
            }),
        lease: 0,
        block: rule.block.filter(|_| !rule.shadow).map(|b| b.wire),
        shadow: rule.shadow,
        slot: rule.in_flight.map(|f| Slot {
            ttl_ms: f.ttl_ms,
            id: String::new(),
        }),
    })
}

/// What a request's body asks a metered rule to reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Nothing: no body, no field, `null`.
    Nothing,
    /// The largest count its fields hold.
    Count(u64),
    /// A body the upstream may read otherwise than the filter can (a number in another
    /// form, a repeated key, a byte order mark, another charset, a compressed body,
    /// malformed JSON): it may ask for anything.
    Unreadable,
}

/// What a request of a metered rule reserves: the largest it asks, in the meter's reserve
/// header or (`body`, once read) in its body's reserve fields, at most the meter's
/// `max_reserve`; the meter's `reserve` when it asks nothing readable in the header and
/// nothing in the body (a header of garbage reserves what none does); `max_reserve` when
/// its body cannot be read as the upstream reads it.
pub fn reservation(meter: &MeterPolicy, req: &impl RequestView, body: Asked) -> u64 {
    let body = match body {
        Asked::Unreadable => return meter.max_reserve,
        Asked::Count(n) => Some(n),
        Asked::Nothing => None,
    };
    let asked = meter
        .reserve_header
        .as_deref()
        .and_then(|name| req.header(name));
    let header = asked
        .filter(|v| !v.is_empty() && v.len() <= 20 && v.iter().all(u8::is_ascii_digit))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    let read = header.max(body).filter(|&n| n >= 1);
    read.map_or(meter.reserve, |n| n.min(meter.max_reserve))
}

/// Resolves the identities `ids` not resolved yet for this request into `values` (by
/// identity index: `Some(None)` once resolved and absent).
fn resolve<'r>(
    config: &Config,
    req: &'r impl RequestView,
    body: Option<&'r BodyValues>,
    values: &mut [Option<Option<Cow<'r, str>>>],
    ids: &[usize],
) -> Result<(), Unplanned> {
    for &id in ids {
        if let (Some(slot @ None), Some(identity)) = (values.get_mut(id), config.identities.get(id))
        {
            *slot = Some(match &identity.source {
                Source::Body(path) => match body.ok_or(Unplanned::AwaitsBody)?.get(id) {
                    Some(Ok(value)) => value.as_deref().map(Cow::Borrowed),
                    Some(Err(problem)) => {
                        return Err(Unplanned::Bad(BadIdentity {
                            at: Place::Body(path.join(".")),
                            problem: *problem,
                        }))
                    }
                    None => None,
                },
                source => identity::resolve(source, req)?,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
