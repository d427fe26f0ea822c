//! One rule of the configuration (`rules[]`, or a `_rules_` entry's): what it is keyed on,
//! what it matches, its limit and tiers, and what it adds (a block, a lease, shadow mode),
//! validated against the configuration's identities. A rule's name is checked here; that it
//! is unique across all the lists is the whole configuration's to check (`config`).

use crate::block::{BlockPolicy, RawBlock};
use crate::error::{err, ConfigError};
use crate::global::RawGlobal;
use crate::in_flight::{InFlight, RawInFlight};
use crate::keys::{validate_name, validate_rule_name};
use crate::lease::{LeasePolicy, RawLease};
use crate::limit::{Limit, RawLimit};
use crate::matcher::{Matcher, RawMatch};
use crate::meter::{MeterPolicy, RawMeter};
use crate::options::Mode;
use crate::source::{Identity, Missing, Source};
use ratelimit_protocol::calendar::Period;
use ratelimit_protocol::global::Global;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    name: String,
    #[serde(default)]
    key: Vec<String>,
    #[serde(default, rename = "match")]
    matcher: RawMatch,
    limit: Option<RawLimit>,
    in_flight: Option<RawInFlight>,
    cost: Option<u64>,
    #[serde(default)]
    tiers: BTreeMap<String, RawLimit>,
    #[serde(default = "default_tier_identity")]
    tier_identity: String,
    block: Option<RawBlock>,
    lease: Option<RawLease>,
    meter: Option<RawMeter>,
    global: Option<RawGlobal>,
    mode: Option<Mode>,
    missing: Option<Missing>,
    time_zone: Option<String>,
}

fn default_tier_identity() -> String {
    "tier".into()
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    /// Indexes into `Config::identities` whose values make up the bucket key.
    pub key: Vec<usize>,
    /// For each of `key`, what to do with a request that lacks it: the rule's `missing`,
    /// else the identity's.
    pub missing: Vec<Missing>,
    pub matcher: Matcher,
    pub limit: Limit,
    /// Tokens one request takes (a metered rule's: what it reserves unless the request
    /// asks for another reservation).
    pub cost: u64,
    /// Index of the identity whose value selects a tier, when the rule has tiers.
    pub tier_identity: Option<usize>,
    /// Tier value → limit used instead of `limit` for clients of that tier.
    pub tiers: Vec<(String, Limit)>,
    /// Block clients denied too often.
    pub block: Option<BlockPolicy>,
    /// Lease tokens of a hot bucket to the worker.
    pub lease: Option<LeasePolicy>,
    /// A cost read from the response, reserved at the check and settled at its end.
    pub meter: Option<MeterPolicy>,
    /// One budget across regions, kept by the ledger of its home region.
    pub global: Option<Global>,
    /// An in-flight rule: how many requests of a key may be in flight at once (`limit` is
    /// then its slots as they travel, `InFlight::limit`).
    pub in_flight: Option<InFlight>,
    /// Where its calendar quotas' periods start (an IANA time zone name; `UTC` unless the
    /// rule says): `Some` exactly when its limit or a tier's is a calendar quota.
    pub time_zone: Option<String>,
    /// Shadow mode (the rule's or the whole plugin's): never denies.
    pub shadow: bool,
    /// The `_rules_` entry (`Config::scopes`) the rule belongs to; `None`: a top-level rule.
    pub scope: Option<usize>,
}

impl Rule {
    /// The limit for a client of `tier` (none, or one the rule does not name: its limit).
    /// The filter plans with it, and the bridge's `usage` reads a bucket with it.
    pub fn limit_for(&self, tier: Option<&str>) -> Limit {
        tier.and_then(|t| self.tiers.iter().find(|(name, _)| name == t))
            .map_or(self.limit, |(_, limit)| *limit)
    }

    /// The calendar terms a check of this rule under `limit` (its own or a tier's) carries:
    /// the period and the rule's time zone, when `limit` is a calendar quota.
    pub fn calendar(&self, limit: &Limit) -> Option<(Period, &str)> {
        limit.calendar.zip(self.time_zone.as_deref())
    }
}

/// Position of the identity called `name`.
fn identity_index(identities: &[Identity], name: &str) -> Option<usize> {
    identities.iter().position(|i| i.name == name)
}

impl RawRule {
    /// The rule at `field`, keyed on `identities` (the configuration's, by name); in shadow
    /// mode if the whole plugin is (`plugin_shadow`) or the rule says so.
    pub(crate) fn validate(
        self,
        field: &str,
        identities: &[Identity],
        plugin_shadow: bool,
    ) -> Result<Rule, ConfigError> {
        validate_rule_name(&format!("{field}.name"), &self.name)?;
        let mut key = Vec::with_capacity(self.key.len());
        for (i, name) in self.key.iter().enumerate() {
            let Some(index) = identity_index(identities, name) else {
                return err(
                    format!("{field}.key[{i}]"),
                    format!("no identity named {name:?}"),
                );
            };
            if key.contains(&index) {
                return err(
                    format!("{field}.key[{i}]"),
                    format!("{name:?} is listed twice"),
                );
            }
            key.push(index);
        }
        if key.is_empty() && self.missing.is_some() {
            return err(
                format!("{field}.missing"),
                "only applies to a rule with a key",
            );
        }
        let of_identity = |id: usize| identities.get(id).map(|i| i.missing);
        let missing = (key.iter())
            .map(|&id| self.missing.or(of_identity(id)).unwrap_or_default())
            .collect();
        let matcher = self.matcher.validate(&format!("{field}.match"))?;
        if self.cost == Some(0) {
            return err(format!("{field}.cost"), "must be at least 1");
        }
        if self.meter.is_some() && self.cost.is_some() {
            return err(
                format!("{field}.cost"),
                "a metered rule's cost is what its response measures: give the meter a \
                 reserve instead",
            );
        }
        if self.meter.is_some() && self.lease.is_some() {
            return err(
                format!("{field}.lease"),
                "a metered rule takes no lease: each request's reservation is settled on its \
                 own",
            );
        }
        // A meter's reservations are checked against the limits once they are known.
        let cost = self.cost.unwrap_or(1);
        let (limit, in_flight) = match (self.limit, self.in_flight) {
            (Some(limit), None) => (limit.validate(&format!("{field}.limit"), cost)?, None),
            (None, Some(raw)) => {
                let what = [
                    (self.cost.is_some(), "cost"),
                    (!self.tiers.is_empty(), "tiers"),
                    (self.block.is_some(), "block"),
                    (self.lease.is_some(), "lease"),
                    (self.meter.is_some(), "meter"),
                    (self.global.is_some(), "global"),
                ];
                if let Some((_, what)) = what.iter().find(|(has, _)| *has) {
                    return err(
                        format!("{field}.{what}"),
                        "an in_flight rule counts requests in flight, one slot each: it takes \
                         no cost, tiers, block, lease, meter nor global (give those to a rule \
                         of their own beside it)",
                    );
                }
                let in_flight = raw.validate(&format!("{field}.in_flight"))?;
                let limit = in_flight
                    .limit()
                    .or_else(|(_, problem)| err(format!("{field}.in_flight"), problem))?;
                (limit, Some(in_flight))
            }
            (Some(_), Some(_)) => {
                return err(
                    format!("{field}.in_flight"),
                    "a rule has a limit or in_flight, not both (give each a rule of its own)",
                )
            }
            (None, None) => return err(format!("{field}.limit"), "missing field `limit`"),
        };
        let mut tiers = Vec::with_capacity(self.tiers.len());
        for (tier, raw) in self.tiers {
            validate_name(&format!("{field}.tiers"), &tier)?;
            tiers.push((
                tier.clone(),
                raw.validate(&format!("{field}.tiers.{tier}"), cost)?,
            ));
        }
        let meter = match self.meter {
            Some(raw) => {
                let tier_limits = tiers.iter().map(|(_, limit)| limit);
                Some(raw.validate(&format!("{field}.meter"), &limit, tier_limits)?)
            }
            None => None,
        };
        if let Some(meter) = &meter {
            for (tier, limit) in &tiers {
                meter.fits(&format!("{field}.tiers.{tier}"), limit)?;
            }
        }
        let cost = meter.as_ref().map_or(cost, |m| m.reserve);
        let tier_identity = if tiers.is_empty() {
            None
        } else {
            match identity_index(identities, &self.tier_identity) {
                Some(index) if identities.get(index).is_some_and(|i| i.trusted) => Some(index),
                Some(index) => {
                    let why = match identities.get(index).map(|i| &i.source) {
                        Some(Source::Body(_)) => {
                            "mark the identity \"trusted\": true if its value names what the \
                             upstream serves and bills (a model), so that choosing it is \
                             choosing its price"
                        }
                        _ => {
                            "use a verified JWT claim, or mark the identity \"trusted\": true \
                             if a filter before this one sets it (and drops what the client \
                             sent)"
                        }
                    };
                    return err(
                        format!("{field}.tier_identity"),
                        format!(
                            "identity {:?} is a value the client writes itself, so a client \
                             could pick its own tier: {why}",
                            self.tier_identity
                        ),
                    );
                }
                None => {
                    return err(
                        format!("{field}.tier_identity"),
                        format!("tiers need an identity named {:?}", self.tier_identity),
                    )
                }
            }
        };
        let block = match self.block {
            Some(raw) => Some(raw.validate(&format!("{field}.block"))?),
            None => None,
        };
        let lease = match self.lease {
            Some(raw) => Some(raw.validate(&format!("{field}.lease"), &limit)?),
            None => None,
        };
        let time_zone = calendar_zone(field, self.time_zone, &limit, &tiers)?;
        if time_zone.is_some() {
            let what = [
                (lease.is_some(), "lease"),
                (self.global.is_some(), "global"),
            ];
            if let Some((_, what)) = what.iter().find(|(has, _)| *has) {
                return err(
                    format!("{field}.{what}"),
                    "a calendar quota takes no lease nor global: its tokens come back all at \
                     once at the period's start, so tokens held elsewhere across it would be \
                     spent twice",
                );
            }
        }
        let global = match self.global {
            Some(raw) => {
                let what = [
                    (block.is_some(), "blocks"),
                    (lease.is_some(), "leases to workers"),
                    (meter.is_some(), "meters"),
                ];
                if let Some((_, what)) = what.iter().find(|(has, _)| *has) {
                    return err(
                        format!("{field}.global"),
                        format!("a global rule that {what} is not supported yet"),
                    );
                }
                Some(raw.validate(&format!("{field}.global"))?)
            }
            None => None,
        };
        let shadow = plugin_shadow || self.mode == Some(Mode::Shadow);
        Ok(Rule {
            name: self.name,
            key,
            missing,
            matcher,
            limit,
            cost,
            tier_identity,
            tiers,
            block,
            lease,
            meter,
            global,
            in_flight,
            time_zone,
            shadow,
            scope: None,
        })
    }
}

/// The time zone of a rule whose `limit` or `tiers` hold a calendar quota: `zone` as the
/// rule wrote it (its grammar checked; whether the database has it is the bridge's to
/// say, and `check-config`'s), else `UTC`. A rule with no calendar quota takes none.
fn calendar_zone(
    field: &str,
    zone: Option<String>,
    limit: &Limit,
    tiers: &[(String, Limit)],
) -> Result<Option<String>, ConfigError> {
    let calendar = std::iter::once(limit)
        .chain(tiers.iter().map(|(_, l)| l))
        .any(|l| l.calendar.is_some());
    match zone {
        None => Ok(calendar.then(|| "UTC".to_string())),
        Some(_) if !calendar => err(
            format!("{field}.time_zone"),
            "only applies to a calendar quota (a limit per day, week, month, year or with an \
             anchor)",
        ),
        Some(zone) if ratelimit_protocol::calendar::zone_name(&zone) => Ok(Some(zone)),
        Some(zone) => err(
            format!("{field}.time_zone"),
            format!("{zone:?} is not a time zone name like Europe/Paris or UTC"),
        ),
    }
}
