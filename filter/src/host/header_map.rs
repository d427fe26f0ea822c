//! The proxy-wasm ABI's serialized header map, read in place.
//!
//! The filter must see every value of an identity header (Envoy's single-value read
//! returns the first only, so a repeated header would go unnoticed). Fetching the whole
//! map is one host call; reading it in place, instead of building a `String` and a `Vec`
//! per header as the SDK does, keeps that call nearly free.
//!
//! Layout: the number of pairs `n` (u32, little-endian), then `n` pairs of sizes (key,
//! value; u32 each), then each key and value in order, each followed by a NUL byte.

/// A serialized header map; a malformed one reads as empty, never panics.
#[derive(Debug, Default, Clone)]
pub struct HeaderMap {
    bytes: Vec<u8>,
}

impl HeaderMap {
    pub fn new(bytes: Vec<u8>) -> HeaderMap {
        HeaderMap { bytes }
    }

    /// Every `(name, value)` pair in order; stops at the first inconsistency.
    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let count = read_u32(&self.bytes, 0).and_then(|n| usize::try_from(n).ok());
        let table_end = count.and_then(|n| n.checked_mul(8)?.checked_add(4));
        let (sizes, mut data) = match table_end.and_then(|end| self.bytes.get(4..end)) {
            Some(sizes) => (sizes, self.bytes.get(sizes.len() + 4..).unwrap_or_default()),
            None => (&[][..], &[][..]),
        };
        sizes.chunks_exact(8).map_while(move |pair| {
            let key_len = usize::try_from(read_u32(pair, 0)?).ok()?;
            let value_len = usize::try_from(read_u32(pair, 4)?).ok()?;
            let (key, rest) = data.split_at_checked(key_len)?;
            let (value, rest) = rest.get(1..)?.split_at_checked(value_len)?;
            data = rest.get(1..).unwrap_or_default();
            Some((key, value))
        })
    }

    /// The values of header `name` (lower-case, as the host delivers names), in order.
    pub fn values<'a, 'n>(&'a self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.pairs()
            .filter(move |(key, _)| *key == name.as_bytes())
            .map(|(_, value)| value)
    }
}

/// `pairs` in this layout, as the host takes a local reply's headers.
pub fn serialize<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    // Lengths past u32 cannot be described; in wasm32 no buffer comes near.
    let le = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let data: usize = pairs
        .iter()
        .map(|(k, v)| k.as_ref().len() + v.as_ref().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(4 + 8 * pairs.len() + data);
    out.extend(le(pairs.len()));
    for (key, value) in pairs {
        out.extend(le(key.as_ref().len()));
        out.extend(le(value.as_ref().len()));
    }
    for (key, value) in pairs {
        out.extend(key.as_ref());
        out.push(0);
        out.extend(value.as_ref());
        out.push(0);
    }
    out
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(raw.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_of_a_header_is_seen_in_order() {
        let pairs: [(&str, &[u8]); 4] = [
            (":path", b"/a"),
            ("x-user-id", b"victim"),
            ("x-empty", b""),
            ("x-user-id", b"\xffattacker"),
        ];
        let map = HeaderMap::new(serialize(&pairs));
        let read: Vec<(&[u8], &[u8])> = map.pairs().collect();
        let written: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (k.as_bytes(), *v)).collect();
        assert_eq!(read, written, "what is serialized reads back");
        let users: Vec<&[u8]> = map.values("x-user-id").collect();
        assert_eq!(users, [&b"victim"[..], b"\xffattacker"]);
        assert_eq!(map.values(":path").collect::<Vec<_>>(), [b"/a"]);
        assert_eq!(map.values("x-empty").collect::<Vec<_>>(), [b""]);
        assert_eq!(map.values("x-none").count(), 0);
    }

    #[test]
    fn malformed_maps_read_as_far_as_they_are_consistent() {
        let good = serialize(&[("a", b"1"), ("b", b"2")]);
        // The last NUL is not needed to read the last value.
        for cut in 0..good.len() - 1 {
            let map = HeaderMap::new(good[..cut].to_vec());
            assert!(map.pairs().count() < 2, "cut at {cut}");
        }
        let mut huge = good.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(HeaderMap::new(huge).pairs().count(), 0);
        let mut lying = good;
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(HeaderMap::new(lying).pairs().count(), 0);
        assert_eq!(HeaderMap::default().pairs().count(), 0);
    }
}
