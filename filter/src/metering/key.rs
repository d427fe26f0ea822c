//! A JSON string's escapes, and the key kept of it for comparison with the paths.
//!
//! Only a key that some path may match is kept, and only up to `MAX_KEY_LEN` bytes as
//! decoded: a longer one is dropped, not grown, and matches nothing. Every string's
//! escapes are checked (a malformed one makes the value malformed), but a key is decoded
//! only where an escape is one byte (`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`,
//! `\u0000` to `\u007F`): a key with any other `\u` escape is dropped, as no path an
//! operator writes names a key only by its escapes, and decoding UTF-16 surrogate pairs
//! for it would be code without a use.

use super::paths::MAX_KEY_LEN;

/// `len` of a key not kept: too long, undecodable, or matching no path.
const DROPPED: usize = MAX_KEY_LEN + 1;

/// What the byte after a backslash was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Escape {
    /// A one-byte escape: the string goes on.
    Done,
    /// `\u`: four hex digits follow.
    Unicode,
    Malformed,
}

#[derive(Debug)]
pub(super) struct Key {
    bytes: [u8; MAX_KEY_LEN],
    len: usize,
    /// The `\u` escape's code point so far.
    code: u32,
}

impl Key {
    pub(super) fn new() -> Key {
        Key {
            bytes: [0; MAX_KEY_LEN],
            len: DROPPED,
            code: 0,
        }
    }

    /// A new string: kept if `keep`, else only its escapes checked.
    pub(super) fn start(&mut self, keep: bool) {
        self.len = if keep { 0 } else { DROPPED };
    }

    pub(super) fn kept(&self) -> bool {
        self.len < DROPPED
    }

    /// The key as decoded, if kept.
    pub(super) fn get(&self) -> Option<&[u8]> {
        self.bytes.get(..self.len)
    }

    /// More of the key's text, without escapes.
    pub(super) fn push(&mut self, text: &[u8]) {
        if !self.kept() {
            return;
        }
        let end = self.len.saturating_add(text.len());
        match self.bytes.get_mut(self.len..end) {
            Some(room) => {
                room.copy_from_slice(text);
                self.len = end;
            }
            None => self.len = DROPPED,
        }
    }

    /// The byte after a backslash.
    pub(super) fn escape(&mut self, b: u8) -> Escape {
        let decoded = match b {
            b'"' | b'\\' | b'/' => b,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                self.code = 0;
                return Escape::Unicode;
            }
            _ => return Escape::Malformed,
        };
        self.push(&[decoded]);
        Escape::Done
    }

    /// One of a `\u` escape's hex digits, `left` of them still to come with this one;
    /// false if it is not one.
    pub(super) fn unicode(&mut self, left: u8, b: u8) -> bool {
        let Some(digit) = char::from(b).to_digit(16) else {
            return false;
        };
        self.code = (self.code << 4) | digit;
        if left <= 1 {
            match u8::try_from(self.code) {
                Ok(ascii) if ascii < 0x80 => self.push(&[ascii]),
                _ => self.len = DROPPED,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept key of `parts`: text, or the bytes after a backslash.
    fn decode(parts: &[(&str, bool)]) -> Option<Vec<u8>> {
        let mut key = Key::new();
        key.start(true);
        for &(part, escaped) in parts {
            if !escaped {
                key.push(part.as_bytes());
                continue;
            }
            let bytes = part.as_bytes();
            match key.escape(bytes[0]) {
                Escape::Done => {}
                Escape::Unicode => {
                    for (i, &b) in bytes[1..].iter().enumerate() {
                        assert!(key.unicode(4 - i as u8, b), "{part}");
                    }
                }
                Escape::Malformed => return None,
            }
        }
        key.get().map(<[u8]>::to_vec)
    }

    #[test]
    fn one_byte_escapes_decode_into_the_key() {
        let parts = [
            ("a", false),
            ("\"", true),
            ("\\", true),
            ("/", true),
            ("t", true),
        ];
        assert_eq!(decode(&parts), Some(b"a\"\\/\t".to_vec()));
        let unicode = [
            ("u0075", true),
            ("sage", false),
            ("u007F", true),
            ("u0000", true),
        ];
        assert_eq!(decode(&unicode), Some(b"usage\x7f\x00".to_vec()));
    }

    #[test]
    fn a_key_with_a_non_ascii_escape_is_dropped_and_a_bad_escape_is_malformed() {
        assert_eq!(decode(&[("caf", false), ("u00e9", true)]), None);
        assert_eq!(decode(&[("ud83d", true), ("ude00", true)]), None);
        let mut key = Key::new();
        key.start(false);
        assert_eq!(key.escape(b'q'), Escape::Malformed);
        assert!(!key.unicode(4, b'g'));
    }

    #[test]
    fn a_key_is_kept_up_to_its_limit_and_dropped_past_it() {
        let mut key = Key::new();
        key.start(true);
        key.push(&[b'k'; MAX_KEY_LEN - 1]);
        key.push(b"k");
        assert_eq!(key.get().map(<[u8]>::len), Some(MAX_KEY_LEN));
        key.push(b"k");
        assert_eq!(key.get(), None);
        key.push(&[b'k'; 1000]);
        assert!(!key.kept(), "dropped stays dropped");
        key.start(true);
        assert_eq!(key.get(), Some(&b""[..]));
    }
}
