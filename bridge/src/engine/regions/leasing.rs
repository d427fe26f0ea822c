//! How this bridge's leases come and go (docs/regions.md): asked for ahead of need, beside
//! the rule's claims (`agree`), so that no request waits on another region once its key is
//! warm; given back when they end here; the claims made again while their rules are used;
//! and a key's ledger read as it stands, for `usage`.

use super::metrics::Event;
use super::{holder, ledger, wall_ms, Regions, Terms, IDLE_MS, QUIET_MS};
use crate::store::check::RuleSpec;
use crate::store::health;
use ledger::Mode;
use ratelimit_protocol::global::Global;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Regions {
    /// Asks `rule`'s ledger for more of its tokens if its leases here run low (`Holder::ask`):
    /// in the background, so that no request waits on it once its key is warm.
    pub(super) fn ask_ahead(self: &Arc<Self>, rule: &RuleSpec, global: &Global) {
        let (Some(home), Ok(split)) = (self.home_of(global, &rule.key), self.split(rule, global))
        else {
            return;
        };
        let regions = u64::try_from(self.names.len()).unwrap_or(1).max(1);
        let most = (split.ledger.capacity / regions).max(rule.cost);
        let terms = || Terms {
            home: home.to_string(),
            shape: Some(split.ledger),
            ttl_ms: global.ttl_ms,
        };
        let now = self.now_ms();
        let asked = (self.holder()).ask(&rule.key, rule.cost, global.ttl_ms, most, now, terms);
        let (Some(ask), Some(store)) = (asked, self.stores.get(home).cloned()) else {
            return;
        };
        let this = Arc::clone(self);
        let (key, ttl_ms, home) = (rule.key.clone(), global.ttl_ms, home.to_string());
        let (rule_id, claim) = self.agreement.claim_of(&rule.key, &global.home);
        tokio::spawn(async move {
            let started = Instant::now();
            let call = ledger::call(
                &store,
                &key,
                Mode::Grant,
                &this.holder_id,
                ask.seq,
                ask.tokens,
                ttl_ms,
                split.ledger,
            );
            let limit = this.wait.max(Duration::from_millis(ttl_ms / 2));
            let timed = async {
                let reply = tokio::time::timeout(limit, call).await;
                (reply, started.elapsed())
            };
            // Nothing is spent before the bridges are known to agree on this ledger's place:
            // the claims are made beside the grant, so that a cold key pays one round trip,
            // and a grant made while they disagree is stranded (fewer admissions, never more).
            let stores = this.all_stores();
            let agreed = (this.agreement).agreed(&stores, &rule_id, &claim, this.wait);
            let (agreed, (reply, took)) = tokio::join!(agreed, timed);
            this.metrics.ledger_call(&home, took);
            if !agreed {
                this.holder().quiet(&key, ask.seq, this.now_ms() + QUIET_MS);
                match reply {
                    Ok(Ok(granted)) if granted.tokens > 0 => {
                        this.lease(Event::Stranded, granted.tokens)
                    }
                    _ => {}
                }
                this.lease(Event::Refused, 0);
                return;
            }
            let now = this.now_ms();
            let mut holder = this.holder();
            // Never more than was asked, whatever the reply says (a ledger is Redis's, and
            // what Redis says is trusted no further than that).
            let reply = reply.map(|r| {
                r.map(|r| ledger::Reply {
                    tokens: r.tokens.min(ask.tokens),
                    ..r
                })
            });
            match reply {
                Ok(Ok(reply)) if reply.tokens > 0 => {
                    let event =
                        match holder.granted(&key, ask.seq, reply.tokens, reply.level, ttl_ms, now)
                        {
                            true => Event::Granted,
                            false => Event::Stranded,
                        };
                    drop(holder);
                    this.lease(event, reply.tokens);
                }
                Ok(Ok(reply)) => {
                    holder.granted(&key, ask.seq, 0, reply.level, ttl_ms, now);
                    holder.quiet(&key, ask.seq, now + reply.wait_ms.clamp(QUIET_MS, ttl_ms));
                    drop(holder);
                    this.lease(Event::Refused, 0);
                }
                Ok(Err(e)) => {
                    holder.quiet(&key, ask.seq, now + QUIET_MS);
                    drop(holder);
                    log::debug!("ledger of {key} on {home}: {e}");
                    this.lease(Event::Failed, 0);
                }
                Err(_) => {
                    // A grant whose answer is lost strands its tokens until the ledger's
                    // lease ends; none is ever used twice.
                    holder.quiet(&key, ask.seq, now + QUIET_MS);
                    drop(holder);
                    this.lease(Event::Failed, 0);
                }
            }
        });
    }

    /// Leases over here, or spent: they go back to their ledgers with their unspent tokens
    /// (best effort: a return that does not arrive leaves them stranded until the
    /// ledger's lease ends).
    pub fn tick(self: &Arc<Self>) {
        let due = self.agreement.due();
        if !due.is_empty() {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let stores = this.all_stores();
                let rounds = (due.iter())
                    .map(|(rule, claim)| this.agreement.round(&stores, rule, claim, this.wait));
                futures_util::future::join_all(rounds).await;
            });
        }
        let ended = self.holder().expire(self.now_ms(), IDLE_MS);
        if !ended.is_empty() {
            // In the background: the next tick must not wait a round trip to the homes.
            let this = Arc::clone(self);
            tokio::spawn(async move { this.give_back(ended).await });
        }
    }

    /// Gives every lease back: a bridge shutting down.
    pub async fn drain(self: &Arc<Self>) {
        let all = self.holder().drain();
        self.give_back(all).await;
    }

    /// Returns `ended` to their ledgers, all at once (one lost return must not hold up the
    /// others for `wait`).
    async fn give_back(&self, ended: Vec<holder::Ended<Terms>>) {
        let returns = ended.into_iter().map(|end| async move {
            if end.left > 0 {
                self.lease(Event::Expired, end.left);
            }
            let (Some(store), Some(shape)) = (self.stores.get(&end.about.home), end.about.shape)
            else {
                return;
            };
            let sent = ledger::call(
                store,
                &end.key,
                Mode::Return,
                &self.holder_id,
                end.seq,
                end.left,
                end.about.ttl_ms,
                shape,
            );
            match tokio::time::timeout(self.wait, sent).await {
                Ok(Ok(reply)) => self.lease(Event::Returned, reply.tokens),
                _ => self.lease(Event::Stranded, end.left),
            }
        });
        futures_util::future::join_all(returns).await;
    }

    /// The ledger of `rule` (a global one) as it stands at its home, for `usage`: the home,
    /// whole tokens held and out on leases, how many leases, and learning's end (Unix
    /// seconds, or null); `None` for a rule that is not global.
    pub async fn ledger_of(&self, rule: &RuleSpec) -> Option<Result<serde_json::Value, String>> {
        let global = rule.global.as_ref()?;
        let home = self.home_of(global, &rule.key)?;
        let (Some(store), Ok(split)) = (self.stores.get(home), self.split(rule, global)) else {
            return None;
        };
        let read = ledger::call(
            store,
            &rule.key,
            Mode::Read,
            "",
            0,
            0,
            global.ttl_ms,
            split.ledger,
        );
        Some(read.await.map(|r| {
            let now_s = wall_ms() / 1000;
            serde_json::json!({
                "home": home,
                "ledger": {"tokens": r.level, "leased": r.outstanding, "leases": r.leases,
                           "capacity": split.ledger.capacity},
                "learning_until": (r.learning_until_ms > 0)
                    .then(|| now_s + (r.learning_until_ms.saturating_sub(r.now_ms)).div_ceil(1000)),
                "share": split.share.map(|s| s.capacity),
            })
        }))
    }

    /// Runs `tick` every 100 ms until `stop`, then gives every lease back. Keeps every
    /// region's connection remade as soon as its Redis answers again (`health::watch`: a
    /// connection left alone after a partition would be remade only by the next ask).
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let watching: Vec<_> = (self.stores.values())
            .map(|store| tokio::spawn(health::watch(store.clone())))
            .collect();
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = every.tick() => self.tick(),
                _ = stop.changed() => break,
            }
        }
        for task in watching {
            task.abort();
        }
        self.drain().await;
    }
}
