//! The one digest of the filter and its configuration: SHA-256, wherever hostile bytes must
//! be shortened into a name (an oversized identity value, a key past the bridge's bound,
//! the filter's local-mode slot). Here, beside the keys that need it, so that the bridge
//! digests a value an operator types exactly as a gateway does.
//!
//! Collision resistance matters: a client that could choose two values with one digest
//! would share (and drain) another client's bucket.

use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes` in lower-case hex (64 characters).
pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// A number in `0..n` spread by SHA-256 (n > 0).
pub fn bucket_of(bytes: &[u8], n: u64) -> u64 {
    let first = Sha256::digest(bytes)
        .iter()
        .take(8)
        .fold(0u64, |h, &b| h << 8 | u64::from(b));
    first % n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // FIPS 180-2 test vectors.
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn buckets_stay_in_range_and_spread() {
        let hit: std::collections::HashSet<u64> = (0..2000u32)
            .map(|i| bucket_of(&i.to_le_bytes(), 16))
            .collect();
        assert_eq!(hit.len(), 16);
        assert!(hit.iter().all(|&b| b < 16));
    }
}
