//! The engine every front door shares: what runs a door's checks, reads and settlements
//! once the door has read them. One value, `Engine`, holds the store (Redis as the bridge
//! uses it), the regions (global rules' leases, `--region`), the operators' overrides in
//! force and the clients' plans, so that the filter's wire, the rate limit service, the admin endpoints and the
//! commands all take the same step: a line is refused if the regions refuse one of its
//! global rules, runs under the overrides in force, and a check's global rules are paid
//! from this bridge's leases before the rest of it goes to Redis.
//!
//! Its modules, bottom to top:
//!
//! - `calendar`: where calendar quotas' periods start, by the bundled time zone database.
//! - `overrides`: what an emergency override is, its records in Redis, the table that
//!   applies them, and the refresh that keeps this bridge's table fresh.
//! - `plans`: clients' own limits, named, without expiry, read as they change.
//! - `regions`: global rules: one budget across regions, a home ledger's tokens spent
//!   through leases this bridge holds (`holder`, `ledger`, `flags`), and their series.
//! - `unblock`: lifting a rule's block (`lua/unblock.lua`).

pub mod calendar;
pub mod overrides;
pub mod plans;
pub mod regions;
pub mod unblock;

use crate::store::check::{Check, CheckOutcome};
use crate::store::keyspace::Keyspace;
use crate::store::Store;
use overrides::cache::OverrideCache;
use overrides::table::Table;
use plans::table::PlanTable;
use regions::Regions;
use std::sync::Arc;

/// What a line means to do with its buckets: which decides whether an override applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Take its cost (a check).
    Check,
    /// Read the buckets, taking nothing.
    Read,
    /// Correct what a check took (a settlement).
    Settle,
    /// Give back a lease's tokens: to the rule's own bucket, which alone gives leases (none
    /// is taken under an override), so no override applies.
    Return,
}

/// The store, the regions and the overrides: what every door runs its lines through.
/// Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    /// Redis as the bridge uses it: where every line runs, merged with every other door's
    /// lines into one script call per node.
    store: Store,
    /// This bridge's region and the others' (`--region`): a check's global rules are paid
    /// from its leases. Without it a global rule is a plain one, the one region's.
    regions: Option<Arc<Regions>>,
    /// The operators' overrides in force, kept fresh by `registry::refresh`.
    overrides: Arc<OverrideCache>,
    /// The clients' plans, kept up to date by `plans::registry::refresh`.
    plans: Arc<PlanTable>,
}

/// One exchange's (or one call's) way in: each of its lines refused or made ready under the
/// same table of overrides, the one in force when it began.
pub struct Intake<'e> {
    engine: &'e Engine,
    overrides: Arc<Table>,
}

impl Engine {
    /// The engine over `store`, with `regions` if the bridge has any; no override applies
    /// until `registry::refresh` reads them.
    pub fn new(store: Store, regions: Option<Arc<Regions>>) -> Engine {
        Engine {
            store,
            regions,
            overrides: Arc::default(),
            plans: Arc::default(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn regions(&self) -> Option<&Arc<Regions>> {
        self.regions.as_ref()
    }

    /// The overrides applied (`registry::refresh` replaces them).
    pub fn overrides(&self) -> &OverrideCache {
        &self.overrides
    }

    /// The plans applied (`plans::registry::refresh` keeps them up to date).
    pub fn plans(&self) -> &Arc<PlanTable> {
        &self.plans
    }

    /// The way in for one exchange or call, under the overrides in force now.
    pub fn intake(&self) -> Intake<'_> {
        Intake {
            engine: self,
            overrides: self.overrides.table(),
        }
    }

    /// Runs `checks` together, one outcome per check, in order, each all-or-nothing, their
    /// global rules paid from the leases (`regions`).
    pub async fn check_all(&self, checks: &[Check]) -> Vec<CheckOutcome> {
        match &self.regions {
            Some(regions) => regions.check_all(&self.store, checks).await,
            None => self.store.check_all(checks).await,
        }
    }

    /// Runs one check, as `check_all`.
    pub async fn check(&self, check: &Check) -> CheckOutcome {
        match &self.regions {
            Some(regions) => (regions.check_all(&self.store, std::slice::from_ref(check)))
                .await
                .pop()
                .unwrap_or_else(|| Err("no answer".into())),
            None => self.store.check(check).await,
        }
    }

    /// `check`'s buckets as they stand, writing nothing.
    pub async fn read(&self, check: &Check) -> CheckOutcome {
        self.store.read(check).await
    }

    /// Runs `settlements` together, one outcome each.
    pub async fn settle_all(&self, settlements: &[Check]) -> Vec<CheckOutcome> {
        self.store.settle_all(settlements).await
    }

    /// Gives leases' tokens back to their buckets, one outcome per return.
    pub async fn return_leases(&self, returns: &[Check]) -> Vec<CheckOutcome> {
        self.store.return_leases(returns).await
    }
}

impl Intake<'_> {
    /// `rules`, for `intent`, made ready to run: refused (and why) if the regions refuse
    /// a global rule of it (`Regions::refusal`), else under its overrides (but a lease's
    /// return, `Intent::Return`). For lines whose keys the bridge made itself (the rate limit
    /// service's).
    pub fn admit(&self, intent: Intent, rules: &mut Check) -> Result<(), String> {
        self.ready(intent, rules, None)
    }

    /// As `admit`, for a gateway's line: its keys must also lie in the store's keyspace
    /// (`Keyspace::refusal`), asked after the regions.
    pub fn admit_gateways(&self, intent: Intent, rules: &mut Check) -> Result<(), String> {
        self.ready(intent, rules, Some(self.engine.store.keyspace()))
    }

    fn ready(
        &self,
        intent: Intent,
        rules: &mut Check,
        keyspace: Option<&Keyspace>,
    ) -> Result<(), String> {
        let global = (self.engine.regions.as_ref()).and_then(|r| r.refusal(rules));
        if let Some(why) = global.or_else(|| keyspace.and_then(|k| k.refusal(rules))) {
            return Err(why);
        }
        calendar::bound(rules)?;
        // A client's plan is its limit, for every kind of line (a lease's tokens go back
        // to a bucket of the plan's size); an override beats it.
        self.engine.plans.apply(rules);
        if intent != Intent::Return {
            self.overrides.apply(rules);
        }
        Ok(())
    }
}
