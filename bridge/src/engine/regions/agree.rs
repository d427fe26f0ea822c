//! Bridges agreeing on where a global rule's ledgers are (docs/regions.md, "Agreement").
//! Two bridges that name different regions (`--region-redis`), or whose gateways give a
//! rule different homes, would keep two ledgers for one key: two budgets, and nothing in
//! either ledger would show it. So every bridge **claims**, in every region's Redis, what
//! it holds of each global rule it serves (the home its gateways give the rule and the
//! regions it names), every `ROUND_MS` while the rule is used, and reads the others'
//! claims (`lua/claims.lua`). Another claim makes it refuse the rule (a log line,
//! `global_disagreements_total`, each check failing per the gateway's failure mode) until
//! a round that reaches every region finds none: a claim lapses `CLAIM_MS` after its
//! bridge stopped making it.
//!
//! It grants nothing of a rule before such a round found no other claim: the newcomer of
//! a rolling restart that moves a home or adds a region sees the claims of the bridges
//! already serving the rule in a region they share, and refuses at once; those see the
//! newcomer's claim at their next round, within `ROUND_MS`, and refuse too, having spent
//! meanwhile from one ledger only. One budget, never two, for as long as bridges that
//! disagree reach a region in common.

use crate::store::Store;
use ratelimit_protocol::key::parse_key;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The script that keeps claims.
pub const CLAIMS_LUA: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/claims.lua"));

/// How often a rule's claims are made again while it is used.
const ROUND_MS: u64 = 1_000;
/// How long a claim lives unless made again: two rounds late to a slow region are not a
/// lapse, and a bridge gone is forgotten within seconds.
const CLAIM_MS: u64 = 3_500;
/// How long a rule no check used stays claimed.
const IDLE_MS: u64 = 60_000;

/// What this bridge makes of a rule's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No round has reached every region yet: nothing is granted.
    Unknown,
    /// Every claim seen is this bridge's.
    Agreed,
    /// Another bridge claims the rule otherwise: its checks are refused, for this reason.
    Disagree(String),
}

struct Claim {
    mine: String,
    verdict: Verdict,
    /// When its last round started, if one has; whether a round is out.
    round_ms: Option<u64>,
    out: bool,
    used_ms: u64,
}

/// The claims of the global rules this bridge serves, and its verdict on each.
pub struct Agreement {
    /// This bridge's region, and every region it names, sorted and joined.
    own: String,
    regions: String,
    claims: Mutex<HashMap<String, Claim>>,
    /// Wakes the grants that wait for a round out (`agreed`) when one ends.
    rounds: Notify,
    started: Instant,
}

/// Where `rule`'s claims are kept: beside nothing a gateway can name (`{`).
fn claims_key(rule: &str) -> String {
    format!("{rule}{{{rule}}}#claims")
}

/// The rule a bucket key is of: its leading `prefix:rule` (the key itself if it is none).
fn rule_of(key: &str) -> &str {
    match parse_key(key) {
        Ok(k) => key.get(..k.prefix.len() + 1 + k.rule.len()).unwrap_or(key),
        Err(_) => key,
    }
}

impl Agreement {
    /// For a bridge of region `own` naming `names` (sorted).
    pub fn new(own: &str, names: &[String]) -> Agreement {
        Agreement {
            own: own.to_string(),
            regions: names.join(","),
            claims: Mutex::new(HashMap::new()),
            rounds: Notify::new(),
            started: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn claims(&self) -> MutexGuard<'_, HashMap<String, Claim>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rule `key` is a key of (every key of a rule has the same terms) and what this
    /// bridge claims of it, its home being `home` (empty: chosen from each key among the
    /// regions named).
    pub fn claim_of(&self, key: &str, home: &str) -> (String, String) {
        (rule_of(key).to_string(), self.mine(home))
    }

    fn mine(&self, home: &str) -> String {
        let home = if home.is_empty() {
            "chosen-from-the-key"
        } else {
            home
        };
        format!("home={home} regions={}", self.regions)
    }

    /// The verdict on the rule of `key` (its home `home`), which a check uses now: a look
    /// in a map, and an allocation only for a rule seen the first time.
    pub fn verdict(&self, key: &str, home: &str) -> Verdict {
        let rule = rule_of(key);
        let now = self.now_ms();
        let mut claims = self.claims();
        if let Some(claim) = claims.get_mut(rule) {
            claim.used_ms = now;
            return claim.verdict.clone();
        }
        let claim = Claim {
            mine: self.mine(home),
            verdict: Verdict::Unknown,
            round_ms: None,
            out: false,
            used_ms: now,
        };
        claims.insert(rule.to_string(), claim);
        Verdict::Unknown
    }

    /// The rules whose round is due (none out, and `ROUND_MS` since the last), each marked
    /// out: the caller runs them. Rules unused for `IDLE_MS` are forgotten (their claims
    /// lapse).
    pub fn due(&self) -> Vec<(String, String)> {
        let now = self.now_ms();
        let mut claims = self.claims();
        claims.retain(|_, c| now.saturating_sub(c.used_ms) < IDLE_MS);
        let mut due = Vec::new();
        for (rule, claim) in claims.iter_mut() {
            let last = claim.round_ms.map_or(0, |at| at + ROUND_MS);
            if !claim.out && (claim.round_ms.is_none() || now >= last) {
                claim.out = true;
                claim.round_ms = Some(now);
                due.push((rule.clone(), claim.mine.clone()));
            }
        }
        due
    }

    /// Whether `rule` may be granted: a verdict, or a first round (run here, or waited for
    /// when one is out) within `wait`.
    pub async fn agreed(
        &self,
        stores: &[(String, Store)],
        rule: &str,
        mine: &str,
        wait: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Made before the look, so that a round ending after it wakes this one.
            let ended = self.rounds.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let run = {
                let mut claims = self.claims();
                let Some(claim) = claims.get_mut(rule) else {
                    return false;
                };
                match &claim.verdict {
                    Verdict::Agreed => return true,
                    Verdict::Disagree(_) => return false,
                    Verdict::Unknown if claim.round_ms.is_some() && !claim.out => return false,
                    Verdict::Unknown if claim.out => false,
                    Verdict::Unknown => {
                        claim.out = true;
                        claim.round_ms = Some(self.now_ms());
                        true
                    }
                }
            };
            if run {
                return self.round(stores, rule, mine, wait).await == Verdict::Agreed;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// Makes this bridge's claim of `rule` in every region and reads the others'; records
    /// and returns the verdict. A round that some region did not answer keeps the verdict
    /// as it was, unless another claim was seen: a partition neither lets a bridge start
    /// granting nor stops one that grants.
    pub async fn round(
        &self,
        stores: &[(String, Store)],
        rule: &str,
        mine: &str,
        wait: Duration,
    ) -> Verdict {
        let script = redis::Script::new(CLAIMS_LUA);
        let key = claims_key(rule);
        let life = CLAIM_MS.to_string();
        let calls = stores.iter().map(|(region, store)| {
            let (script, key, life) = (&script, &key, &life);
            async move {
                let (keys, args) = ([key.as_str()], [mine, life.as_str()]);
                let call = store.eval::<Vec<String>>(script, &keys, &args);
                (region, tokio::time::timeout(wait, call).await)
            }
        });
        let mut every = true;
        let mut other = None;
        for (region, reply) in futures_util::future::join_all(calls).await {
            match reply {
                Ok(Ok(others)) => {
                    if let Some(theirs) = others.into_iter().next() {
                        other.get_or_insert((region.clone(), theirs));
                    }
                }
                _ => every = false,
            }
        }
        let mut claims = self.claims();
        // Whatever it found, the grants waiting for it look again.
        self.rounds.notify_waiters();
        let Some(claim) = claims.get_mut(rule) else {
            return Verdict::Unknown;
        };
        claim.out = false;
        let verdict = match other {
            Some((region, theirs)) => Verdict::Disagree(format!(
                "bridges disagree on where global rule {rule}'s ledgers are: this bridge \
                 (region {}) has {mine}, a claim in {region}'s Redis has {theirs} \
                 (docs/regions.md)",
                self.own
            )),
            None if every => Verdict::Agreed,
            None => claim.verdict.clone(),
        };
        if verdict != claim.verdict {
            match &verdict {
                Verdict::Disagree(why) => log::error!("{why}: its checks fail until they agree"),
                Verdict::Agreed if claim.verdict != Verdict::Unknown => {
                    log::warn!("global rule {rule}: every bridge claims it alike again, served")
                }
                _ => {}
            }
            claim.verdict = verdict.clone();
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_names_the_rule_its_home_and_the_regions() {
        let names = ["a".to_string(), "b".to_string(), "c".to_string()];
        let agreement = Agreement::new("a", &names);
        let (rule, mine) = agreement.claim_of("rl:tenant:tenant-1", "b");
        assert_eq!(rule, "rl:tenant");
        assert_eq!(mine, "home=b regions=a,b,c");
        assert_eq!(agreement.claim_of("rl:tenant:other", "b").0, rule);
        let (_, chosen) = agreement.claim_of("rl:tenant:tenant-1", "");
        assert_eq!(chosen, "home=chosen-from-the-key regions=a,b,c");
        let fewer = Agreement::new("a", &names[..2]);
        assert_ne!(fewer.claim_of("rl:tenant:tenant-1", "b").1, mine);
        assert!(parse_key(&claims_key("rl:tenant")).is_err());
    }

    #[test]
    fn a_rule_is_due_once_a_round_then_every_round() {
        let agreement = Agreement::new("a", &["a".to_string()]);
        assert_eq!(agreement.verdict("rl:r:v", "b"), Verdict::Unknown);
        assert_eq!(agreement.due().len(), 1);
        assert!(agreement.due().is_empty(), "one round out at a time");
    }
}
