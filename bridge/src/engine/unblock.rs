//! Lifting a rule's automatic block (`ratelimit-bridge unblock`, `DELETE /admin/blocks`):
//! an operator's answer to a client locked out by someone else's denials, such as a
//! spoofer who writes the victim's identity header. The block lives in the bucket's own
//! value, so lifting it is one call of `lua/unblock.lua` (beside the token bucket script,
//! which defines the value's format) on that one key: the block and the count of denials go,
//! the bucket's level stays (no token is made up). Every gateway asks again within a second
//! (`deny_cache::BLOCK_TRUST_MS`), so the client is admitted everywhere by then.

use crate::engine::overrides::Target;
use crate::store::Store;

/// The script that lifts blocks.
const UNBLOCK_LUA: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/unblock.lua"));

/// Lifts the block of `target`'s bucket (a client's, or the one bucket of a rule keyed on
/// nothing); whether it was blocked. A bucket that was not, or holds nothing of ours, is
/// left as it was (only its count of denials is cleared).
pub async fn unblock(store: &Store, target: &Target) -> Result<bool, String> {
    let script = redis::Script::new(UNBLOCK_LUA);
    let (_now, lifted): (u64, u64) = store.eval(&script, &[&target.key], &[]).await?;
    Ok(lifted > 0)
}
