//! Plans in Redis: written by operators and billing systems (`lua/plans.lua`, the record,
//! the log and the change number together), followed by every bridge. A bridge reads each
//! prefix's plans once in full, then every `FOLLOW_EVERY` only the log's entries past the
//! last it applied: a few `XRANGE`s for a bulk import (one entry per call of `BATCH`
//! plans). An entry whose number is not the next one (the log was
//! trimmed past it while the bridge could not read) makes it read the prefix in full again,
//! and so does a change number below the last applied (Redis lost its plans). An idle tick
//! costs one `GET` per prefix.

use super::records::{self, log_key, plans_key, seq_key};
use super::table::{InForce, PlanTable};
use super::Plan;
use crate::engine::overrides::Target;
use crate::store::Store;
use std::collections::HashMap;
use std::time::Duration;

/// The script that writes and removes plans.
pub const PLANS_LUA: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/plans.lua"));

/// How often a bridge reads the log: a change reaches every gateway within a second.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(250);
/// Plans per script call (and per log entry): a call of 2,000 arguments holds the server
/// a few milliseconds.
pub const BATCH: usize = 1000;
/// Log entries read per `XRANGE` (each of up to `BATCH` plans), and fields per `HSCAN`:
/// what one read holds in memory.
const ENTRIES_PER_READ: usize = 10;
const FIELDS_PER_SCAN: usize = 1000;

/// Writes `plans` (a plan replaces the client's earlier one); how many were written.
pub async fn set(store: &Store, plans: &[Plan]) -> Result<u64, String> {
    let mut written = 0;
    for (prefix, plans) in by_prefix(plans, |p| &p.target) {
        for batch in plans.chunks(BATCH) {
            let records: Vec<String> = batch.iter().map(|p| records::encode(p)).collect();
            let mut args = vec!["set"];
            for (plan, record) in batch.iter().zip(&records) {
                args.extend([plan.target.member(), record.as_str()]);
            }
            written += write(store, prefix, &args).await?;
        }
    }
    Ok(written)
}

/// Removes the plans of `targets`; how many there were.
pub async fn clear(store: &Store, targets: &[Target]) -> Result<u64, String> {
    let mut removed = 0;
    for (prefix, targets) in by_prefix(targets, |t| t) {
        for batch in targets.chunks(BATCH) {
            let mut args = vec!["clear"];
            args.extend(batch.iter().map(|t| t.member()));
            removed += write(store, prefix, &args).await?;
        }
    }
    Ok(removed)
}

/// `items` grouped by their target's prefix, in the order each prefix first appears.
fn by_prefix<T>(items: &[T], target: impl Fn(&T) -> &Target) -> Vec<(&str, Vec<&T>)> {
    let mut groups: Vec<(&str, Vec<&T>)> = Vec::new();
    for item in items {
        let prefix = target(item).prefix.as_str();
        match groups.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, group)) => group.push(item),
            None => groups.push((prefix, vec![item])),
        }
    }
    groups
}

async fn write(store: &Store, prefix: &str, args: &[&str]) -> Result<u64, String> {
    let keys = [plans_key(prefix), log_key(prefix), seq_key(prefix)];
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    store
        .eval(&redis::Script::new(PLANS_LUA), &keys, args)
        .await
}

/// Every plan under `prefix`, and the number of the last change they include; a record
/// that is not ours (only a writer to Redis can put one there) is skipped and logged.
pub async fn list(store: &Store, prefix: &str) -> Result<(u64, Vec<Plan>), String> {
    // The number first: a change between the two reads is in the hash and in the log, and
    // applying it twice is applying it once.
    let seq: Option<u64> = store.query(redis::cmd("GET").arg(seq_key(prefix))).await?;
    let all: HashMap<String, String> = store
        .query(redis::cmd("HGETALL").arg(plans_key(prefix)))
        .await?;
    let mut plans = Vec::with_capacity(all.len());
    for (member, record) in all {
        match records::decode(prefix, &member, &record) {
            Ok(plan) => plans.push(plan),
            Err(e) => log::warn!("ignored: {e}"),
        }
    }
    Ok((seq.unwrap_or(0), plans))
}

/// The plan of the bucket `key` under `prefix`, read from Redis alone (for a process that
/// follows none: an operator's `usage`).
pub async fn find(store: &Store, prefix: &str, key: &str) -> Result<Option<Plan>, String> {
    let Some(member) = key.strip_prefix(prefix).and_then(|k| k.strip_prefix(':')) else {
        return Ok(None);
    };
    let record: Option<String> = store
        .query(redis::cmd("HGET").arg(plans_key(prefix)).arg(member))
        .await?;
    Ok(record.and_then(|r| records::decode(prefix, member, &r).ok()))
}

/// One log entry: its id (`<seq>-0`) and its fields, member then record (`''`: removed).
type Entry = (String, Vec<String>);

/// Where this bridge stands in each prefix's log: the number of the last change applied.
#[derive(Debug, Default)]
pub struct Follower {
    applied: HashMap<String, u64>,
}

impl Follower {
    /// Brings `table` up to date with every prefix of `store`.
    pub async fn follow(&mut self, store: &Store, table: &PlanTable) -> Result<(), String> {
        for prefix in store.keyspace().prefixes() {
            self.follow_prefix(store, table, prefix).await?;
        }
        Ok(())
    }

    async fn follow_prefix(
        &mut self,
        store: &Store,
        table: &PlanTable,
        prefix: &str,
    ) -> Result<(), String> {
        let Some(&applied) = self.applied.get(prefix) else {
            return self.read_whole(store, table, prefix).await;
        };
        // The change number first: nothing to read when it stands still; below what was
        // applied, Redis lost the plans (a restart without persistence, a flush) and
        // numbers them again, and only a whole read drops the ones it lost.
        let seq: Option<u64> = store.query(redis::cmd("GET").arg(seq_key(prefix))).await?;
        match seq.unwrap_or(0) {
            now if now == applied => return Ok(()),
            now if now < applied => {
                log::warn!("plans of {prefix}: change {now} is before {applied}, applied; reading them all");
                return self.read_whole(store, table, prefix).await;
            }
            _ => {}
        }
        loop {
            let Some(&last) = self.applied.get(prefix) else {
                return self.read_whole(store, table, prefix).await;
            };
            let entries: Vec<Entry> = store
                .query(
                    redis::cmd("XRANGE")
                        .arg(log_key(prefix))
                        .arg(format!("({last}-0"))
                        .arg("+")
                        .arg("COUNT")
                        .arg(ENTRIES_PER_READ),
                )
                .await?;
            let mut expected = last + 1;
            let mut changes = Vec::new();
            for (id, fields) in &entries {
                if seq_of(id) != Some(expected) {
                    log::info!(
                        "plans of {prefix}: the log skips change {expected}; reading them all"
                    );
                    return self.read_whole(store, table, prefix).await;
                }
                expected += 1;
                for pair in fields.chunks(2) {
                    let [member, record] = pair else { continue };
                    changes.push(change(prefix, member, record));
                }
            }
            table.update(&[], changes);
            self.applied.insert(prefix.to_string(), expected - 1);
            if entries.len() < ENTRIES_PER_READ {
                return Ok(());
            }
        }
    }

    async fn read_whole(
        &mut self,
        store: &Store,
        table: &PlanTable,
        prefix: &str,
    ) -> Result<(), String> {
        // The number first, as in `list`.
        let seq: Option<u64> = store.query(redis::cmd("GET").arg(seq_key(prefix))).await?;
        let mut all = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, fields): (u64, Vec<String>) = store
                .query(
                    redis::cmd("HSCAN")
                        .arg(plans_key(prefix))
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(FIELDS_PER_SCAN),
                )
                .await?;
            for pair in fields.chunks(2) {
                if let [member, record] = pair {
                    all.push(change(prefix, member, record));
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // In force at once: no check meanwhile finds the prefix without its plans.
        table.update(&[prefix], all);
        self.applied.insert(prefix.to_string(), seq.unwrap_or(0));
        Ok(())
    }
}

/// What a record (`''`: removed) says of a bucket key: its plan now, or none.
fn change(prefix: &str, member: &str, record: &str) -> (Box<str>, Option<InForce>) {
    let key = format!("{prefix}:{member}").into_boxed_str();
    if record.is_empty() {
        return (key, None);
    }
    match records::decode(prefix, member, record) {
        Ok(plan) => (key, Some(InForce::of(plan).1)),
        Err(e) => {
            log::warn!("ignored: {e}");
            (key, None)
        }
    }
}

/// The change number of a log entry's id, `<seq>-0`.
fn seq_of(id: &str) -> Option<u64> {
    id.strip_suffix("-0")?.parse().ok()
}

/// Follows the plans every `FOLLOW_EVERY` into `table`, for as long as it runs, logging when
/// reading them starts and stops failing. Plans are contracts: while Redis cannot be read,
/// the ones last read stay in force.
pub async fn refresh(store: Store, table: std::sync::Arc<PlanTable>) {
    let mut follower = Follower::default();
    let mut failing = false;
    let mut ticks = tokio::time::interval(FOLLOW_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match follower.follow(&store, &table).await {
            Ok(()) => {
                if failing {
                    log::info!("plans are read again");
                    failing = false;
                }
                store.metrics().plans_in_force(table.len());
            }
            Err(e) if !failing => {
                log::warn!(
                    "cannot read the plans ({e}); the {} last read stay in force",
                    table.len()
                );
                failing = true;
            }
            Err(_) => {}
        }
    }
}
