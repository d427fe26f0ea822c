//! Redis Cluster key slots (CRC16/XMODEM of the key or of its `{hash tag}`, mod 16384), so
//! the bridge can find the node that serves each key of a check and send each node one
//! script call.

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM of every byte value, so that a key costs a table lookup per byte rather
/// than eight shifts (the slot of every rule of every check is computed on a Cluster).
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The slot of `key`, honouring a non-empty `{...}` hash tag as Redis does.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_values() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
    }

    #[test]
    fn hash_tags_pick_the_hashed_part() {
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "empty tag: whole key"
        );
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
