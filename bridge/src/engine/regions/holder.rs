//! This bridge's leases of global rules' ledgers: the tokens it may spend without asking
//! any other region, each lease until its holder-side expiry, and when to ask for more.
//!
//! Plain bookkeeping over a clock the caller passes (ms of `Instant` since the bridge
//! started), so that every rule of it is tested without time passing. A lease expires here
//! `ttl x (1 - drift)` after its ask was *sent*, while the ledger counts `ttl` from when it
//! *granted* it, later: whatever the two clocks' rates within the drift, this bridge stops
//! spending a lease before the ledger gives its tokens to anyone else.
//!
//! Spending takes from the lease that expires first (what is left of the other lasts
//! longer); what a denied check took goes back to the lease it came from, if that lease
//! still lives. At most `MAX_LIVE` leases with tokens left a key at once: one spent, one
//! asked ahead (spent ones stay until they end, for what a denied check gives back).

use std::collections::HashMap;

/// Most live leases with tokens left, of one key (the ledger keeps up to 8 of one holder).
pub const MAX_LIVE: usize = 2;
/// Most keys held at once: past it, the key used least recently gives its leases back.
pub const MAX_KEYS: usize = 100_000;

/// One lease: tokens left of `granted`, spendable until `expires_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub seq: u64,
    pub granted: u64,
    pub left: u64,
    pub expires_ms: u64,
}

/// What a check took from a key's leases, to give back if the check is denied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Taken {
    /// (seq of the lease, tokens).
    pub parts: Vec<(u64, u64)>,
}

/// An ask for more of a key's tokens: its sequence number (what makes a repeated ask the
/// same grant at the ledger), how many, and when it was first sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub seq: u64,
    pub tokens: u64,
    pub sent_ms: u64,
}

/// A lease that ended here with tokens unspent: they go back to the ledger (`about`: what
/// the key's last ask said of it, such as where its ledger is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended<T> {
    pub key: String,
    pub seq: u64,
    pub left: u64,
    pub about: T,
}

#[derive(Debug, Default)]
struct Key<T> {
    /// What its last ask said of the key.
    about: T,
    leases: Vec<Lease>,
    /// The ask out, if one is.
    asking: Option<Ask>,
    /// No ask before this (the ledger had nothing, or did not answer).
    quiet_until_ms: u64,
    /// Tokens asked for per second here, smoothed, whether the leases had them or not:
    /// what the next lease is sized on (sized on what was spent, a lease too small would
    /// keep the next one as small).
    rate: f64,
    /// When `rate` was last brought up to date, and what was asked for since.
    rate_ms: u64,
    asked: u64,
    last_used_ms: u64,
    /// The ledger's last answer left it nothing (or it refused, or did not answer): a
    /// check that finds no tokens here is denied at once, not made to wait for the ask out.
    /// Until then (a cold key, or one whose spending outgrew its lease while its home
    /// still had tokens) it waits: a denial is for a budget spent, not for a lease small.
    dry: bool,
}

/// Every key's leases; one per bridge. `T` is what the caller keeps of a key, handed back
/// with its ended leases.
#[derive(Debug)]
pub struct Holder<T> {
    keys: HashMap<String, Key<T>>,
    next_seq: u64,
    /// The share of a lease's life this bridge gives up for clocks that run at different
    /// rates, in millionths.
    drift_ppm: u64,
}

impl<T: Clone + Default> Holder<T> {
    pub fn new(drift_ppm: u64) -> Holder<T> {
        Holder {
            keys: HashMap::new(),
            next_seq: 0,
            drift_ppm,
        }
    }

    /// Takes `cost` tokens of `key` at `now_ms` from its live leases, all or nothing.
    pub fn take(&mut self, key: &str, cost: u64, now_ms: u64) -> Option<Taken> {
        let k = self.keys.get_mut(key)?;
        k.last_used_ms = now_ms;
        k.asked = k.asked.saturating_add(cost);
        let live: u64 = (k.leases.iter())
            .filter(|l| l.expires_ms > now_ms)
            .map(|l| l.left)
            .sum();
        if live < cost {
            return None;
        }
        let mut taken = Taken::default();
        let mut rest = cost;
        for lease in k.leases.iter_mut().filter(|l| l.expires_ms > now_ms) {
            let part = rest.min(lease.left);
            if part > 0 {
                lease.left -= part;
                taken.parts.push((lease.seq, part));
                rest -= part;
            }
        }
        Some(taken)
    }

    /// Gives back what a denied check took, to each lease that still lives.
    pub fn refund(&mut self, key: &str, taken: &Taken, now_ms: u64) {
        let Some(k) = self.keys.get_mut(key) else {
            return;
        };
        for (seq, part) in &taken.parts {
            if let Some(lease) = k.leases.iter_mut().find(|l| l.seq == *seq) {
                if lease.expires_ms > now_ms {
                    lease.left = (lease.left + part).min(lease.granted);
                }
            }
        }
    }

    /// Tokens of `key` spendable now.
    pub fn live(&self, key: &str, now_ms: u64) -> u64 {
        self.keys.get(key).map_or(0, |k| {
            (k.leases.iter())
                .filter(|l| l.expires_ms > now_ms)
                .map(|l| l.left)
                .sum()
        })
    }

    /// Whether a check of `key` that its leases cannot pay should wait for the ask out:
    /// one is, and the ledger has not said it is dry.
    pub fn worth_waiting(&self, key: &str) -> bool {
        self.keys
            .get(key)
            .is_some_and(|k| k.asking.is_some() && !k.dry)
    }

    /// The ask `key` should send now, if any, for a check of `cost` (a fresh one is
    /// recorded as out; one out already is `None`): when its live tokens would not last
    /// half a lease's life at the rate it is asked for, or its newest lease has less than half
    /// its life left, and it holds fewer than `MAX_LIVE` leases. Sized to a lease's life of
    /// spending (at least `cost`), at most `most`. `about` is kept with the key.
    pub fn ask(
        &mut self,
        key: &str,
        cost: u64,
        ttl_ms: u64,
        most: u64,
        now_ms: u64,
        about: impl FnOnce() -> T,
    ) -> Option<Ask> {
        if !self.keys.contains_key(key) && self.keys.len() >= MAX_KEYS {
            return None;
        }
        let seq = self.next_seq + 1;
        let k = self.keys.entry(key.to_string()).or_default();
        k.last_used_ms = now_ms;
        if k.asking.is_some() || now_ms < k.quiet_until_ms {
            return None;
        }
        update_rate(k, now_ms);
        let live = || k.leases.iter().filter(|l| l.expires_ms > now_ms);
        let left: u64 = live().map(|l| l.left).sum();
        let half = ttl_ms / 2;
        let needed = (k.rate * half as f64 / 1000.0) as u64;
        let newest = live().map(|l| l.expires_ms).max().unwrap_or(0);
        let low = left < cost.max(needed) || newest < now_ms + half;
        if !low || live().filter(|l| l.left > 0).count() >= MAX_LIVE {
            return None;
        }
        let sized = (k.rate * ttl_ms as f64 / 1000.0).ceil() as u64;
        let tokens = sized.max(cost).min(most).max(1);
        let ask = Ask {
            seq,
            tokens,
            sent_ms: now_ms,
        };
        self.next_seq = seq;
        k.asking = Some(ask);
        k.about = about();
        Some(ask)
    }

    /// The ledger's answer to `key`'s ask: `granted` tokens (0: none, and no ask again
    /// before `quiet_until_ms`), living `ttl_ms` from the ask's sending, less the drift,
    /// and `left` tokens still at home. Whether a lease was added (a grant that is already
    /// over here is not).
    pub fn granted(
        &mut self,
        key: &str,
        seq: u64,
        granted: u64,
        left: u64,
        ttl_ms: u64,
        now_ms: u64,
    ) -> bool {
        let drift_ppm = self.drift_ppm;
        let Some(k) = self.keys.get_mut(key) else {
            return false;
        };
        let Some(ask) = k.asking.filter(|a| a.seq == seq) else {
            return false;
        };
        k.asking = None;
        k.dry = granted == 0 || left == 0;
        if granted == 0 {
            return false;
        }
        let life = ttl_ms - ttl_ms * drift_ppm / 1_000_000;
        let expires_ms = ask.sent_ms + life;
        if expires_ms <= now_ms {
            return false;
        }
        k.leases.push(Lease {
            seq,
            granted,
            left: granted,
            expires_ms,
        });
        k.leases.sort_by_key(|l| l.expires_ms);
        true
    }

    /// `key`'s ask failed or was refused: ask again no sooner than `until_ms`.
    pub fn quiet(&mut self, key: &str, seq: u64, until_ms: u64) {
        if let Some(k) = self.keys.get_mut(key) {
            if k.asking.is_some_and(|a| a.seq == seq) {
                k.asking = None;
            }
            k.dry = true;
            k.quiet_until_ms = k.quiet_until_ms.max(until_ms);
        }
    }

    /// How long before `key` could have tokens again, as far as this bridge knows: until
    /// the ledger may be asked again, at least 1 ms (an ask out may land any moment). What
    /// a denial says to wait, so that no gateway's deny cache refuses past a grant.
    pub fn retry_ms(&self, key: &str, now_ms: u64) -> u64 {
        let quiet = self.keys.get(key).map_or(0, |k| k.quiet_until_ms);
        quiet.saturating_sub(now_ms).max(1)
    }

    /// The ask out for `key`, if any.
    pub fn asking(&self, key: &str) -> Option<Ask> {
        self.keys.get(key).and_then(|k| k.asking)
    }

    /// Drops the leases over by `now_ms` and those spent, and keys idle past `idle_ms` with
    /// none left: the leases to return, those that ended with tokens unspent and those
    /// spent while they live. A lease's tokens count against its ledger's capacity until
    /// it ends there, spent or not: one spent and not returned would hold the ledger's
    /// refill back for the rest of its life (a key would get `capacity / lease_ttl` a
    /// second at most). What a denied check gives back to a lease returned is lost.
    pub fn expire(&mut self, now_ms: u64, idle_ms: u64) -> Vec<Ended<T>> {
        let mut ended = Vec::new();
        self.keys.retain(|key, k| {
            k.leases.retain(|l| {
                let over = l.expires_ms <= now_ms || l.left == 0;
                if over && (l.left > 0 || l.expires_ms > now_ms) {
                    ended.push(Ended {
                        key: key.clone(),
                        seq: l.seq,
                        left: l.left,
                        about: k.about.clone(),
                    });
                }
                !over
            });
            !(k.leases.is_empty()
                && k.asking.is_none()
                && now_ms.saturating_sub(k.last_used_ms) > idle_ms)
        });
        ended
    }

    /// Every live lease, for giving them all back (a bridge shutting down).
    pub fn drain(&mut self) -> Vec<Ended<T>> {
        let mut all = Vec::new();
        for (key, k) in self.keys.drain() {
            for l in k.leases {
                all.push(Ended {
                    key: key.clone(),
                    seq: l.seq,
                    left: l.left,
                    about: k.about.clone(),
                });
            }
        }
        all
    }
}

/// Brings `k`'s rate of asking up to `now_ms`: an exponential average over about a second.
fn update_rate<T>(k: &mut Key<T>, now_ms: u64) {
    let elapsed = now_ms.saturating_sub(k.rate_ms);
    if elapsed == 0 {
        return;
    }
    let instant = k.asked as f64 * 1000.0 / elapsed as f64;
    let weight = (elapsed as f64 / 1000.0).min(1.0);
    k.rate += (instant - k.rate) * weight;
    k.rate_ms = now_ms;
    k.asked = 0;
}

#[cfg(test)]
#[path = "holder_tests.rs"]
mod tests;
