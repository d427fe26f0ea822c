//! An in-flight rule's slot, as the filter writes it on a rule and the bridge reads it: the
//! rule's bucket key names a set of slots (one per request in flight, each until its expiry),
//! `burst` is how many it holds at most, and the slot is the request's own, named by `id` and
//! kept for `ttl_ms` from each check, renewal or settlement that touches it. Written
//! `|ttl_ms|id` after the rule's other fields.
//!
//! The same rule does different things on each kind of line (`lua/token_bucket.lua`):
//! - a check takes the slot if the set has room (or already holds it), all-or-nothing with
//!   the check's other rules;
//! - a lease return (`+ `) gives it back, which is how a request's end releases it;
//! - a settlement (`= `) renews it, never bringing back one that is gone (a renewal that
//!   arrives after the release must not hold the slot again).
//!
//! A slot no one renews expires `ttl_ms` after it was last touched: a gateway that dies
//! holding slots holds them that long at most.

use crate::id::valid_settlement_id;
use crate::number::push_u64;

/// What starts a slot's terms (a byte no key holds).
pub const SLOT_MARK: char = '|';
/// Shortest and longest life of a slot between renewals, in ms.
pub const MIN_SLOT_TTL_MS: u64 = 1_000;
pub const MAX_SLOT_TTL_MS: u64 = 3_600_000;
/// What a denied slot answers as its wait: slots come back when requests end, which no
/// clock predicts, so a client is told to try again in a second.
pub const SLOT_RETRY_MS: u64 = 1_000;

/// A request's slot in an in-flight rule's set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    /// How long the slot lives from its last check or renewal.
    pub ttl_ms: u64,
    /// The request's slot among the set's (`valid_settlement_id`'s grammar).
    pub id: String,
}

/// Appends a slot's terms to its rule's field (`|ttl_ms|id`).
pub fn encode_slot(body: &mut String, slot: &Slot) {
    body.push(SLOT_MARK);
    push_u64(body, slot.ttl_ms);
    body.push(SLOT_MARK);
    body.push_str(&slot.id);
}

/// Reads the terms after a rule's first `|`, strictly.
pub fn parse_slot(text: &str) -> Result<Slot, String> {
    let Some((ttl, id)) = text.split_once(SLOT_MARK) else {
        return Err("a slot's terms are |ttl_ms|id".into());
    };
    let ttl_ms = (!ttl.is_empty() && ttl.len() <= 16 && ttl.bytes().all(|b| b.is_ascii_digit()))
        .then(|| ttl.parse::<u64>().ok())
        .flatten()
        .filter(|n| (MIN_SLOT_TTL_MS..=MAX_SLOT_TTL_MS).contains(n))
        .ok_or_else(|| format!("a slot lives {MIN_SLOT_TTL_MS} to {MAX_SLOT_TTL_MS} ms"))?;
    if !valid_settlement_id(id) {
        let shown: String = id.chars().take(64).collect();
        return Err(format!("bad slot id {shown:?}"));
    }
    Ok(Slot {
        ttl_ms,
        id: id.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reads_back_as_written() {
        let slot = Slot {
            ttl_ms: 30_000,
            id: "0a1b-2c".into(),
        };
        let mut text = String::new();
        encode_slot(&mut text, &slot);
        assert_eq!(text, "|30000|0a1b-2c");
        assert_eq!(parse_slot(&text[1..]), Ok(slot));
    }

    #[test]
    fn bad_terms_are_refused() {
        for bad in [
            "",
            "30000",
            "30000|",
            "999|a",
            "3600001|a",
            "|a",
            "+30000|a",
            "30000|a b",
            "30000|a|b",
            "30000|a,b",
        ] {
            assert!(parse_slot(bad).is_err(), "{bad:?}");
        }
        let long = format!("30000|{}", "a".repeat(65));
        assert!(parse_slot(&long).is_err());
    }
}
