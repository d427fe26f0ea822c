//! Finding the next byte that matters, eight bytes at a time.
//!
//! Most of a response is runs that mean nothing to the reader: the text inside a JSON
//! string (up to a quote or a backslash), the rest of an event's line (up to its end).
//! Byte by byte those runs were most of the reader's time; tested a word at a time
//! (SWAR, in plain `u64` arithmetic that wasm has natively, without `unsafe` or a crate)
//! they cost a fraction of it.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that is zero, and maybe of bytes above one that is:
/// the lowest bit set is always the first zero byte's.
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// The index of the first byte of `bytes` that is one of `marks`; `bytes.len()` if none is.
pub(super) fn first_of<const N: usize>(bytes: &[u8], marks: [u8; N]) -> usize {
    let all = marks.map(|m| ONES * u64::from(m));
    first_where(
        bytes,
        |word| all.iter().fold(0, |found, m| found | zero_bytes(word ^ m)),
        |c| marks.contains(&c),
    )
}

/// The index of the first byte of `bytes` that ends a JSON string's plain text: a quote,
/// a backslash, or a control character (below 0x20), which a string may not hold raw;
/// `bytes.len()` if none does.
pub(super) fn string_end(bytes: &[u8]) -> usize {
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    first_where(
        bytes,
        // Bytes below 0x20 borrow like zero bytes do below 1: the lowest bit set is the
        // first such byte's.
        |word| {
            zero_bytes(word ^ QUOTES)
                | zero_bytes(word ^ BACKSLASHES)
                | (word.wrapping_sub(SPACES) & !word & HIGHS)
        },
        |c| c == b'"' || c == b'\\' || c < 0x20,
    )
}

/// The index of the first byte of `bytes` that `byte` holds true for, found eight at a
/// time by `word` (the high bit of each byte it holds for, the lowest always right).
fn first_where(bytes: &[u8], word: impl Fn(u64) -> u64, byte: impl Fn(u8) -> bool) -> usize {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for eight in &mut words {
        let found = word(u64::from_le_bytes(
            <[u8; 8]>::try_from(eight).unwrap_or_default(),
        ));
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let rest = words.remainder();
    at + rest.iter().position(|&c| byte(c)).unwrap_or(rest.len())
}

/// The index of the first `a` of `bytes` that a `b` follows; `bytes.len()` if none does.
pub(super) fn pair(bytes: &[u8], a: u8, b: u8) -> usize {
    let (all_a, all_b) = (ONES * u64::from(a), ONES * u64::from(b));
    let mut at = 0;
    // Each word, and the word one byte on: where both hold their byte, the pair starts.
    while let Some(nine) = bytes.get(at..at + 9) {
        let (Some(here), Some(next)) = (nine.first_chunk::<8>(), nine.last_chunk::<8>()) else {
            break;
        };
        let (here, next) = (u64::from_le_bytes(*here), u64::from_le_bytes(*next));
        let mut found = zero_bytes(here ^ all_a) & zero_bytes(next ^ all_b);
        // Bits above a true one may be false: each is checked.
        while found != 0 {
            let i = at + (found.trailing_zeros() / 8) as usize;
            if bytes.get(i) == Some(&a) && bytes.get(i + 1) == Some(&b) {
                return i;
            }
            found &= found - 1;
        }
        at += 8;
    }
    let rest = bytes.get(at..).unwrap_or_default();
    let tail = rest.windows(2).position(|w| w == [a, b]);
    tail.map_or(bytes.len(), |i| at + i)
}

#[cfg(test)]
mod tests {
    use super::{first_of, pair, string_end};
    use crate::fakes::check;
    use proptest::prelude::*;

    fn naive(bytes: &[u8], marks: &[u8]) -> usize {
        bytes
            .iter()
            .position(|c| marks.contains(c))
            .unwrap_or(bytes.len())
    }

    #[test]
    fn the_first_of_either_byte_is_found_at_any_offset_among_its_neighbours() {
        // The marks' neighbours in value, 0x80s and 0xFFs: what a borrow could trip on.
        let filler = [
            0x21, 0x23, 0x5b, 0x5d, 0x09, 0x0b, 0x0c, 0x0e, 0x80, 0xff, 0, 1,
        ];
        for len in 0..40 {
            for at in 0..=len {
                for (mark, other) in [(b'"', b'\\'), (b'\\', b'"'), (b'\n', b'\r'), (b'\r', b'\n')]
                {
                    let mut bytes: Vec<u8> = (0..len).map(|i| filler[(i + at) % 12]).collect();
                    if at < len {
                        bytes[at] = mark;
                    }
                    if at + 1 < len {
                        bytes[at + 1] = other;
                    }
                    assert_eq!(first_of(&bytes, [mark, other]), at.min(len), "{bytes:?}");
                    assert_eq!(first_of(&bytes, [other, mark]), at.min(len), "{bytes:?}");
                    assert_eq!(first_of(&bytes, [0x7f, mark, 0x7e]), at.min(len));
                }
            }
        }
    }

    #[test]
    fn pair_agrees_with_a_byte_by_byte_search_on_any_bytes() {
        // Few distinct bytes, so that pairs and near misses are common.
        let strategy = (prop::collection::vec(0u8..4, 0..60), 0u8..4, 0u8..4);
        check(4096, strategy, |(bytes, a, b)| {
            let naive = bytes.windows(2).position(|w| w == [a, b]);
            prop_assert_eq!(pair(&bytes, a, b), naive.unwrap_or(bytes.len()));
            Ok(())
        });
    }

    #[test]
    fn string_end_agrees_with_a_byte_by_byte_search_on_any_bytes() {
        // Bytes near the marks, so that every word holds some, and borrows cross them.
        let near = prop::sample::select(vec![
            0, 1, 0x1f, 0x20, 0x21, b'"', b'\\', 0x5d, 0x7f, 0x80, 0xff,
        ]);
        let strategy = prop::collection::vec(prop_oneof![near, any::<u8>()], 0..100);
        check(4096, strategy, |bytes| {
            let naive = bytes
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            prop_assert_eq!(string_end(&bytes), naive.unwrap_or(bytes.len()));
            Ok(())
        });
    }

    #[test]
    fn first_of_agrees_with_a_byte_by_byte_search_on_any_bytes() {
        let strategy = (
            prop::collection::vec(any::<u8>(), 0..100),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
        );
        check(2048, strategy, |(bytes, a, b, c)| {
            prop_assert_eq!(first_of(&bytes, [a, b]), naive(&bytes, &[a, b]));
            prop_assert_eq!(first_of(&bytes, [a, b, c]), naive(&bytes, &[a, b, c]));
            Ok(())
        });
    }
}
