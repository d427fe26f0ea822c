//! The grammar of the ids that name a settlement or a slot on the wire.

/// Most bytes of an id.
pub const MAX_SETTLEMENT_ID_LEN: usize = 64;

/// Whether `id` may name a settlement or a slot: 1 to 64 ASCII letters, digits, `-` or `_`
/// (the script keeps it beside the bucket's key, space-separated from the others).
pub fn valid_settlement_id(id: &str) -> bool {
    (1..=MAX_SETTLEMENT_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
