//! Whether a body is UTF-8 throughout, checked chunk by chunk as it passes: JSON and
//! server-sent events are UTF-8, and a reader that would take an event with a broken
//! character (a browser's, replacing it) and one that would refuse it (a strict JSON
//! parser) disagree on what the body said, so the meter cannot trust what it read there.

/// Whether a body that begins with `head` (its first bytes, as many as it has up to three)
/// is one that Python's `json.loads` reads in another encoding than UTF-8, as its
/// `json.detect_encoding` does: after a byte order mark (UTF-8's, or UTF-16's and UTF-32's,
/// which begin with UTF-16's or a NUL), or with a NUL in its first two bytes (UTF-16 or
/// UTF-32 without one). Read as UTF-8, such a body is not JSON at all, yet Python (FastAPI,
/// vLLM, LiteLLM) finds its fields.
pub(super) fn foreign(head: &[u8]) -> bool {
    head.starts_with(b"\xef\xbb\xbf")
        || head.starts_with(b"\xfe\xff")
        || head.starts_with(b"\xff\xfe")
        || head.iter().take(2).any(|&b| b == 0)
}

/// The check so far: a character cut by a chunk's end waits in `pending` for the next.
#[derive(Debug, Default)]
pub(super) struct Utf8 {
    pending: [u8; 4],
    held: u8,
    broken: bool,
}

/// Whether `bytes` are all ASCII, eight at a time: what nearly every chunk of an API's
/// JSON is, checked at a fraction of a full decode's cost (wasm32's words are 4 bytes,
/// std's ASCII check goes by those).
fn ascii(bytes: &[u8]) -> bool {
    let words = bytes.chunks_exact(8);
    let rest = words.remainder();
    let high = words.fold(0, |acc, w| {
        acc | u64::from_ne_bytes(w.try_into().unwrap_or([0x80; 8]))
    });
    high & 0x8080_8080_8080_8080 == 0 && rest.is_ascii()
}

impl Utf8 {
    /// The next chunk of the body.
    pub(super) fn feed(&mut self, mut chunk: &[u8]) {
        if self.broken {
            return;
        }
        if self.held > 0 {
            // Complete the character cut at the last chunk's end, a byte at a time.
            let mut held = usize::from(self.held);
            while let Some(slot) = self.pending.get_mut(held) {
                let Some((&b, rest)) = chunk.split_first() else {
                    self.held = held as u8;
                    return;
                };
                *slot = b;
                held += 1;
                chunk = rest;
                match std::str::from_utf8(self.pending.get(..held).unwrap_or_default()) {
                    Ok(_) => break,
                    Err(e) if e.error_len().is_some() => return self.broke(),
                    Err(_) => {}
                }
            }
            self.held = 0;
        }
        if ascii(chunk) {
            return;
        }
        if let Err(e) = std::str::from_utf8(chunk) {
            let tail = chunk.get(e.valid_up_to()..).unwrap_or_default();
            match e.error_len() {
                // A character cut by the chunk's end (at most 3 bytes): the next completes it.
                None => match self.pending.get_mut(..tail.len()) {
                    Some(pending) => {
                        pending.copy_from_slice(tail);
                        self.held = tail.len() as u8;
                    }
                    None => self.broke(),
                },
                _ => self.broke(),
            }
        }
    }

    /// A unit of text (a message's payload) ends: a character cut there is broken.
    pub(super) fn end(&mut self) {
        if self.held > 0 {
            self.broke();
        }
    }

    fn broke(&mut self) {
        self.broken = true;
        self.held = 0;
    }

    /// Whether everything fed so far is UTF-8, a character still cut short at the end
    /// counting as broken.
    pub(super) fn whole(&self) -> bool {
        !self.broken && self.held == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8;

    fn checked(chunks: &[&[u8]]) -> bool {
        let mut u = Utf8::default();
        for c in chunks {
            u.feed(c);
        }
        u.whole()
    }

    #[test]
    fn utf8_split_anywhere_is_whole_and_a_broken_or_cut_character_is_not() {
        let text = "data: {\"t\":\"héllo ✓ 𝄞\"}\n\n".as_bytes();
        for a in 0..=text.len() {
            for b in a..=text.len() {
                assert!(checked(&[&text[..a], &text[a..b], &text[b..]]), "{a} {b}");
            }
        }
        for bad in [
            &b"\xff"[..],
            b"a\xc3",
            b"\xc3(",
            b"\xed\xa0\x80",
            b"\xf0\x9d\x84",
        ] {
            for at in 0..=bad.len() {
                assert!(!checked(&[&bad[..at], &bad[at..]]), "{bad:?} split at {at}");
            }
        }
        assert!(
            !checked(&[b"\xe2\x9c", b"", b"x"]),
            "a character cut, then ASCII"
        );
    }
}
