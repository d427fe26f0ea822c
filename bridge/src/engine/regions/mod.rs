//! Several regions, one limit (docs/regions.md): a global rule's budget is kept by a
//! ledger in one region's Redis, its *home* (`ledger`), and every region's bridges spend
//! it only through leases of its tokens that they hold in memory (`holder`), asked for
//! ahead of need, so that no request waits on another region once its key is warm and its
//! leases keep up with its spending. A
//! region cut off from the home spends what it holds, then its own share of the limit if
//! the rule keeps one (a plain bucket in its own Redis), then refuses.
//!
//! `check_all` is where a check meets this: its global rules take from this bridge's
//! leases (a cold key waits for its first grant, and so does a key whose spending outran
//! its lease while its home had tokens left), the rest of the check (its other rules,
//! and the shares of global rules the leases could not pay) goes to Redis as before, and a
//! check denied anywhere gives back what it took from the leases: all-or-nothing still.
//! `tick` returns what leases left unspent when they end here (`leasing`, which asks for
//! them too). Bridges that disagree on the regions or on a rule's home refuse the rule
//! rather than keep two ledgers (`agree`).

pub mod agree;
pub mod flags;
pub mod holder;
mod leasing;
pub mod ledger;
pub mod metrics;

use crate::store::check::{Check, CheckOutcome, RuleOutcome, RuleSpec};
use crate::store::Store;
use agree::{Agreement, Verdict};
use holder::{Holder, Taken};
use ledger::{Shape, Split};
use metrics::{Event, GlobalMetrics};
use ratelimit_config::digest;
use ratelimit_protocol::global::Global;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a key with no lease left is remembered (its spending rate, whether it is warm).
const IDLE_MS: u64 = 60_000;
/// How long a refused or failed ask keeps a key quiet, at least.
const QUIET_MS: u64 = 100;

/// What this bridge keeps of a key it leases: where its ledger is and under what terms,
/// to give back what a lease left.
#[derive(Debug, Clone, Default)]
struct Terms {
    home: String,
    shape: Option<Shape>,
    ttl_ms: u64,
}

/// This bridge's region, every region's Redis, and its leases.
pub struct Regions {
    own: String,
    /// Every region's name, sorted: a home chosen from a key is the same on every bridge.
    names: Vec<String>,
    stores: HashMap<String, Store>,
    /// The leases' series, shown on `/metrics`.
    metrics: GlobalMetrics,
    /// Names this bridge at the ledgers: its region and a random part (a restarted bridge
    /// is a new holder; its old leases expire).
    holder_id: String,
    holder: Mutex<Holder<Terms>>,
    started: Instant,
    /// How long a check waits for a grant (a cold key's first, or one its spending outran).
    wait: Duration,
    /// What the bridges serving each global rule claim of it.
    agreement: Agreement,
}

/// What became of a global rule of a check.
enum Paid {
    /// From this bridge's leases.
    Leased(Taken),
    /// By the region's own share, a plain bucket in the check sent to Redis.
    Shared,
    /// Not at all: the check is denied (a rule in shadow mode lets it pass).
    Lacking { wait_ms: u64 },
}

/// A check as it is run: what its global rules took, and the rest of it for Redis.
struct Running {
    paid: Vec<Option<Paid>>,
    /// The rules for Redis, and the place of each in the check.
    rest: Check,
    places: Vec<usize>,
    denied: bool,
    /// Why the check is refused: bridges found to disagree while it waited for a grant.
    refused: Option<String>,
}

impl Regions {
    /// Regions named `stores` (this bridge's own, `own`, among them), leases given up for
    /// `drift_ppm` millionths of their life, a check waiting `wait` at most for a grant.
    pub fn new(
        own: &str,
        stores: Vec<(String, Store)>,
        drift_ppm: u64,
        wait: Duration,
    ) -> Result<Regions, String> {
        let mut names: Vec<String> = stores.iter().map(|(name, _)| name.clone()).collect();
        names.sort();
        names.dedup();
        if names.len() != stores.len() {
            return Err("--region-redis names a region twice".into());
        }
        if !names.iter().any(|n| n == own) {
            return Err(format!("--region {own}: no --region-redis {own}=URL"));
        }
        let random = std::collections::hash_map::RandomState::new();
        let seed = std::hash::BuildHasher::hash_one(&random, Instant::now());
        let agreement = Agreement::new(own, &names);
        Ok(Regions {
            own: own.to_string(),
            names,
            stores: stores.into_iter().collect(),
            metrics: GlobalMetrics::new(),
            holder_id: format!("{own}/{seed:016x}"),
            holder: Mutex::new(Holder::new(drift_ppm)),
            started: Instant::now(),
            wait,
            agreement,
        })
    }

    pub fn own(&self) -> &str {
        &self.own
    }

    /// The leases' series, for `/metrics`.
    pub fn metrics(&self) -> &GlobalMetrics {
        &self.metrics
    }

    fn lease(&self, event: Event, tokens: u64) {
        self.metrics.lease(event, tokens);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn holder(&self) -> MutexGuard<'_, Holder<Terms>> {
        self.holder.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The region whose Redis keeps `key`'s ledger: the one the rule names, else one
    /// chosen from the key, the same on every bridge of every region.
    pub fn home_of(&self, global: &Global, key: &str) -> Option<&str> {
        if !global.home.is_empty() {
            return self
                .names
                .iter()
                .find(|n| **n == global.home)
                .map(String::as_str);
        }
        let n = u64::try_from(self.names.len()).unwrap_or(1).max(1);
        let i = digest::bucket_of(key.as_bytes(), n);
        self.names.get(usize::try_from(i).ok()?).map(String::as_str)
    }

    /// Why a global rule of a check cannot run here, if it cannot: a home no region is, a
    /// share the regions together exceed, bridges that disagree on where its ledgers are.
    pub fn refusal(&self, rules: &[RuleSpec]) -> Option<String> {
        rules.iter().find_map(|rule| {
            let global = rule.global.as_ref()?;
            if self.home_of(global, &rule.key).is_none() {
                return Some(format!("no region {:?} (--region-redis)", global.home));
            }
            if let Err(e) = self.split(rule, global) {
                return Some(e);
            }
            self.disagreement(rule, global)
        })
    }

    /// Why bridges disagree on `rule`'s ledgers, if they are known to: counted.
    fn disagreement(&self, rule: &RuleSpec, global: &Global) -> Option<String> {
        let Verdict::Disagree(why) = self.agreement.verdict(&rule.key, &global.home) else {
            return None;
        };
        self.metrics.disagreed();
        Some(why)
    }

    /// Every region's store, for a round of claims.
    fn all_stores(&self) -> Vec<(String, Store)> {
        (self.stores.iter())
            .map(|(name, store)| (name.clone(), store.clone()))
            .collect()
    }

    fn split(&self, rule: &RuleSpec, global: &Global) -> Result<Split, String> {
        let regions = u64::try_from(self.names.len()).unwrap_or(u64::MAX);
        ledger::split(rule, global.share_ppm, regions)
    }

    /// Runs `checks` on `store` (this region's Redis) with their global rules paid from
    /// this bridge's leases: one outcome per check, in order, each all-or-nothing.
    pub async fn check_all(self: &Arc<Self>, store: &Store, checks: &[Check]) -> Vec<CheckOutcome> {
        let mut running: Vec<Running> = Vec::with_capacity(checks.len());
        let mut waiting = Vec::new();
        for check in checks {
            running.push(self.start(check, &mut waiting));
        }
        if !waiting.is_empty() {
            self.await_grants(&waiting).await;
            for (p, check) in running.iter_mut().zip(checks) {
                self.retry_lacking(p, check);
                p.refused = (check.iter())
                    .find_map(|r| r.global.as_ref().and_then(|g| self.disagreement(r, g)));
            }
        }
        let sent: Vec<Check> = (running.iter())
            .filter(|p| !p.denied && p.refused.is_none() && !p.rest.is_empty())
            .map(|p| p.rest.clone())
            .collect();
        let mut answers = store.check_all(&sent).await.into_iter();
        let mut outcomes = Vec::with_capacity(checks.len());
        for (p, check) in running.into_iter().zip(checks) {
            let answer = match (p.denied || p.refused.is_some(), p.rest.is_empty()) {
                (false, false) => answers.next().unwrap_or_else(|| Err("no answer".into())),
                _ => Ok((wall_ms(), Vec::new())),
            };
            outcomes.push(self.conclude(p, check, answer));
        }
        outcomes
    }

    /// A check's global rules paid from the leases where they can be; the keys among them
    /// that the leases cannot pay and whose grant is worth waiting for go to `waiting`.
    fn start(self: &Arc<Self>, check: &Check, waiting: &mut Vec<String>) -> Running {
        let mut p = Running {
            paid: Vec::with_capacity(check.len()),
            rest: Vec::new(),
            places: Vec::new(),
            denied: false,
            refused: None,
        };
        for (i, rule) in check.iter().enumerate() {
            let Some(global) = &rule.global else {
                p.paid.push(None);
                p.rest.push(rule.clone());
                p.places.push(i);
                continue;
            };
            let now = self.now_ms();
            let taken = self.holder().take(&rule.key, rule.cost, now);
            self.ask_ahead(rule, global);
            match taken {
                Some(taken) => p.paid.push(Some(Paid::Leased(taken))),
                None => {
                    if self.holder().worth_waiting(&rule.key) {
                        waiting.push(rule.key.clone());
                    }
                    p.paid.push(Some(self.lacking(
                        rule,
                        global,
                        &mut p.rest,
                        &mut p.places,
                        i,
                    )));
                }
            }
        }
        p.denied = p
            .paid
            .iter()
            .zip(check)
            .any(|(paid, rule)| matches!(paid, Some(Paid::Lacking { .. })) && !rule.shadow);
        p
    }

    /// A global rule the leases cannot pay: its region's share, if the rule keeps one (a
    /// plain bucket of the region's Redis, `rest`), else nothing.
    fn lacking(
        &self,
        rule: &RuleSpec,
        global: &Global,
        rest: &mut Check,
        places: &mut Vec<usize>,
        i: usize,
    ) -> Paid {
        match self.split(rule, global) {
            Ok(Split {
                share: Some(share), ..
            }) => {
                rest.push(RuleSpec {
                    burst: share.capacity,
                    num: share.num,
                    den: share.den,
                    global: None,
                    ..rule.clone()
                });
                places.push(i);
                Paid::Shared
            }
            _ => Paid::Lacking {
                wait_ms: self.holder().retry_ms(&rule.key, self.now_ms()),
            },
        }
    }

    /// After the grants waited for came (or did not in time): the global rules that
    /// went unpaid take from the leases again.
    fn retry_lacking(self: &Arc<Self>, p: &mut Running, check: &Check) {
        for (paid, rule) in p.paid.iter_mut().zip(check) {
            if let Some(Paid::Lacking { .. }) = paid {
                if let Some(taken) = self.holder().take(&rule.key, rule.cost, self.now_ms()) {
                    *paid = Some(Paid::Leased(taken));
                }
            }
        }
        p.denied = p
            .paid
            .iter()
            .zip(check)
            .any(|(paid, rule)| matches!(paid, Some(Paid::Lacking { .. })) && !rule.shadow);
    }

    /// Waits until no ask of `keys` is out, or `wait` has passed.
    async fn await_grants(&self, keys: &[String]) {
        let deadline = Instant::now() + self.wait;
        while Instant::now() < deadline {
            let done = {
                let holder = self.holder();
                keys.iter().all(|k| holder.asking(k).is_none())
            };
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A check's outcome from what its global rules took and Redis's `answer` for the
    /// rest; a check denied anywhere gives back what the leases gave it. The rules of a
    /// check denied before Redis ran none of it show as passed, nothing known.
    fn conclude(&self, p: Running, check: &Check, answer: CheckOutcome) -> CheckOutcome {
        let (now_ms, rest) = match (answer, p.refused) {
            (Ok(answer), None) => answer,
            (Err(e), _) | (_, Some(e)) => {
                self.refund(&p.paid, check);
                return Err(e);
            }
        };
        if p.denied || rest.iter().any(|r| !r.allowed) {
            self.refund(&p.paid, check);
        }
        let now = self.now_ms();
        let mut outcomes = Vec::with_capacity(check.len());
        for (i, (paid, rule)) in p.paid.iter().zip(check).enumerate() {
            outcomes.push(match paid {
                None | Some(Paid::Shared) => {
                    let at = p.places.iter().position(|&place| place == i);
                    let mut o = (at.and_then(|at| rest.get(at).copied())).unwrap_or(RuleOutcome {
                        allowed: true,
                        ..RuleOutcome::default()
                    });
                    if paid.is_some() && o.wait_ms > 0 {
                        // The share lacks it; a lease may come sooner.
                        o.wait_ms = o.wait_ms.min(self.holder().retry_ms(&rule.key, now));
                    }
                    o
                }
                Some(Paid::Leased(_)) => RuleOutcome {
                    allowed: true,
                    remaining: self.holder().live(&rule.key, now),
                    ..RuleOutcome::default()
                },
                // A rule in shadow mode lacking its cost lets its check pass.
                Some(Paid::Lacking { wait_ms }) => RuleOutcome {
                    allowed: rule.shadow,
                    wait_ms: (*wait_ms).max(1),
                    ..RuleOutcome::default()
                },
            });
        }
        Ok((now_ms, outcomes))
    }

    /// Gives back to the leases what a denied check took from them.
    fn refund(&self, paid: &[Option<Paid>], check: &Check) {
        let now = self.now_ms();
        let mut holder = self.holder();
        for (paid, rule) in paid.iter().zip(check) {
            if let Some(Paid::Leased(taken)) = paid {
                holder.refund(&rule.key, taken, now);
            }
        }
    }
}

/// The wall clock in ms, for a check that went to no Redis.
fn wall_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}
