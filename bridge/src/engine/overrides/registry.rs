//! Overrides in Redis: written and removed by operators (`lua/overrides.lua`, one call that
//! keeps the record and the index together), read by every bridge every
//! `REFRESH_EVERY` into its `OverrideCache`. Each override is a record that holds its expiry
//! and a member of its prefix's index, so a bridge learns every active override with one
//! `ZRANGE` and one `MGET` per prefix, without a `SCAN` over the buckets, on one server as
//! on a Cluster (all of them share one hash tag: see `overrides`). Redis does not expire
//! them (a key with a TTL is what `maxmemory-policy volatile-ttl` may evict, and the buckets
//! need that policy): readers skip a record past its expiry by Redis's clock (`TIME`), and
//! the next `set` or `clear` deletes it.

use super::cache::REFRESH_EVERY;
use super::records::{self, index_key, record_key};
use super::table::Table;
use super::{Override, Target};
use crate::engine::Engine;
use crate::store::Store;
use ratelimit_config::limit::Limit;

/// The script that writes and removes overrides.
pub const OVERRIDES_LUA: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/overrides.lua"));

/// Sets the override of `target` to `limit` for `ttl_ms`; the override as Redis holds it.
pub async fn set(
    store: &Store,
    target: Target,
    limit: Limit,
    ttl_ms: u64,
) -> Result<Override, String> {
    let ttl = ttl_ms.to_string();
    let expires_ms = write(store, &target, "set", &[&records::encode(&limit), &ttl]).await?;
    Ok(Override {
        target,
        limit,
        expires_ms,
    })
}

/// Removes the override of `target`; whether there was one.
pub async fn clear(store: &Store, target: &Target) -> Result<bool, String> {
    Ok(write(store, target, "clear", &[]).await? > 0)
}

/// One call of `lua/overrides.lua` on `target` in `mode` with `extra` arguments; what it
/// returns after the Redis time.
async fn write(store: &Store, target: &Target, mode: &str, extra: &[&str]) -> Result<u64, String> {
    let (index, record) = (
        index_key(&target.prefix),
        record_key(&target.prefix, target.member()),
    );
    let mut all = vec![mode, target.member()];
    all.extend_from_slice(extra);
    let script = redis::Script::new(OVERRIDES_LUA);
    let (_now, result): (u64, u64) = store.eval(&script, &[&index, &record], &all).await?;
    Ok(result)
}

/// The active overrides under `prefix`, soonest to expire first. A record that is not ours
/// (a foreign value under the namespace, which only a writer to Redis can put there) is
/// never applied; it is logged at debug level, as this runs four times a second.
pub async fn list(store: &Store, prefix: &str) -> Result<Vec<Override>, String> {
    let members: Vec<String> = store
        .query(redis::cmd("ZRANGE").arg(index_key(prefix)).arg(0).arg(-1))
        .await?;
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let mut mget = redis::cmd("MGET");
    for member in &members {
        mget.arg(record_key(prefix, member));
    }
    let records: Vec<Option<String>> = store.query(&mget).await?;
    // Read last, so that a record applies only if still in force once read. (In a Cluster
    // TIME comes from any node, whose clock agrees with the index's to NTP's milliseconds.)
    let (seconds, micros): (u64, u64) = store.query(&redis::cmd("TIME")).await?;
    let now_ms = seconds * 1000 + micros / 1000;
    let mut active = Vec::with_capacity(members.len());
    // A member whose record is gone was cleared since (or, written by an older bridge,
    // expired in Redis).
    for (member, record) in members.iter().zip(records) {
        match record.map(|value| records::decode(prefix, member, &value)) {
            Some(Ok(o)) if o.expires_ms > now_ms => active.push(o),
            Some(Ok(_)) => {}
            Some(Err(e)) => log::debug!("ignored: {e}"),
            None => {}
        }
    }
    Ok(active)
}

/// Every override of every prefix the store works under, as a table.
async fn load(store: &Store) -> Result<Table, String> {
    let mut all = Vec::new();
    for prefix in store.keyspace().prefixes() {
        all.extend(list(store, prefix).await?);
    }
    Ok(Table::new(all))
}

/// Reads the overrides every `REFRESH_EVERY` from the engine's store into its cache, for as
/// long as it runs, logging when reading them starts and stops failing.
pub async fn refresh(engine: Engine) {
    let mut failing = false;
    let mut ticks = tokio::time::interval(REFRESH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match load(engine.store()).await {
            Ok(table) => {
                if failing {
                    log::info!("overrides are read again");
                    failing = false;
                }
                engine.overrides().replace(table);
            }
            Err(e) if !failing => {
                log::warn!("cannot read the overrides ({e}); none applies past a second");
                failing = true;
            }
            Err(_) => {}
        }
    }
}
