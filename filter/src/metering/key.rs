//! A JSON string's escapes, and the text kept of it: a key, for comparison with the
//! paths, or a string value at a text path (an identity, such as a request's `model`).
//!
//! Only a string that some path may use is kept, and only up to the room made for it with
//! the reader (`KEY_ROOM` bytes as decoded, `MAX_TEXT_LEN` for a reader of texts): a
//! longer one is dropped, not grown. Every string's escapes are checked (a malformed one
//! makes the value malformed). A value is decoded only where an escape is one byte (`\"`,
//! `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000` to `\u007F`): one with any other
//! `\u` escape is dropped, as a model's name is ASCII. A key is decoded whole but for
//! surrogates: Go's JSON reader takes `"max_to\u212Aens"` (a Kelvin sign) for `max_tokens`,
//! so the paths must see that key as written to tell it apart (`paths::go_fold`); no
//! character of a surrogate pair folds to ASCII, so a key with one matches no path however
//! it reads. (What a dropped value means is the caller's: a text it cannot read.)

use super::paths::MAX_KEY_LEN;

/// Longest string value kept, in bytes as decoded.
pub const MAX_TEXT_LEN: usize = 256;

/// Room for a key: the longest segment a path has, each of its ASCII letters written as the
/// three bytes of a non-ASCII character Go folds to it (`K`, U+212A).
pub(super) const KEY_ROOM: usize = 3 * MAX_KEY_LEN;

/// `len` of a string not kept: too long, undecodable, or of no use.
const DROPPED: usize = usize::MAX;

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
    /// Its room, made once: a reader's size does not grow with it.
    bytes: Box<[u8]>,
    len: usize,
    /// The `\u` escape's code point so far.
    code: u32,
    /// The string is a key: a non-ASCII escape is decoded, not dropped.
    name: bool,
}

impl Key {
    /// A string of up to `room` bytes kept.
    pub(super) fn new(room: usize) -> Key {
        Key {
            bytes: vec![0; room].into_boxed_slice(),
            len: DROPPED,
            code: 0,
            name: false,
        }
    }

    /// A new string value: kept if `keep`, else only its escapes checked.
    pub(super) fn start(&mut self, keep: bool) {
        self.len = if keep { 0 } else { DROPPED };
        self.name = false;
    }

    /// A new key: kept if `keep`, decoded whole.
    pub(super) fn start_name(&mut self, keep: bool) {
        self.start(keep);
        self.name = true;
    }

    pub(super) fn kept(&self) -> bool {
        self.len < DROPPED
    }

    /// The string as decoded, if kept.
    pub(super) fn get(&self) -> Option<&[u8]> {
        self.bytes.get(..self.len)
    }

    /// More of the string's text, without escapes.
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
            match (u8::try_from(self.code), char::from_u32(self.code)) {
                (Ok(ascii), _) if ascii < 0x80 => self.push(&[ascii]),
                (_, Some(c)) if self.name => self.push(c.encode_utf8(&mut [0; 4]).as_bytes()),
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
        let mut key = Key::new(MAX_TEXT_LEN);
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
        let mut key = Key::new(MAX_TEXT_LEN);
        key.start(false);
        assert_eq!(key.escape(b'q'), Escape::Malformed);
        assert!(!key.unicode(4, b'g'));
    }

    #[test]
    fn a_key_decodes_a_non_ascii_escape_but_not_a_surrogate() {
        let mut key = Key::new(KEY_ROOM);
        key.start_name(true);
        key.push(b"max_to");
        assert_eq!(key.escape(b'u'), Escape::Unicode);
        for (i, &b) in b"212A".iter().enumerate() {
            assert!(key.unicode(4 - i as u8, b));
        }
        key.push(b"ens");
        assert_eq!(key.get(), Some("max_to\u{212A}ens".as_bytes()));
        key.start_name(true);
        key.escape(b'u');
        for (i, &b) in b"d83d".iter().enumerate() {
            key.unicode(4 - i as u8, b);
        }
        assert_eq!(key.get(), None, "half a surrogate pair is no character");
        key.start(true);
        key.escape(b'u');
        for (i, &b) in b"212a".iter().enumerate() {
            key.unicode(4 - i as u8, b);
        }
        assert_eq!(key.get(), None, "a value still drops it");
    }

    #[test]
    fn a_string_is_kept_up_to_its_limit_and_dropped_past_it() {
        let mut key = Key::new(MAX_TEXT_LEN);
        key.start(true);
        key.push(&[b'k'; MAX_TEXT_LEN - 1]);
        key.push(b"k");
        assert_eq!(key.get().map(<[u8]>::len), Some(MAX_TEXT_LEN));
        key.push(b"k");
        assert_eq!(key.get(), None);
        key.push(&[b'k'; 1000]);
        assert!(!key.kept(), "dropped stays dropped");
        key.start(true);
        assert_eq!(key.get(), Some(&b""[..]));
    }
}
