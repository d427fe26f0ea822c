//! Splitting text at one ASCII byte. Every separator of the format (newline, space, comma,
//! colon) is ASCII and every field is short: a plain scan of the bytes costs about half of
//! what `str::split` with a `char` does, whose searcher is made for long texts (measured
//! on the bridge, where parsing a check was a tenth of its instructions).

/// The pieces of `text` between the `sep` bytes, as `str::split(sep)` gives them. `sep`
/// must be ASCII, so that every piece is whole UTF-8.
pub fn split(text: &str, sep: u8) -> Split<'_> {
    debug_assert!(sep.is_ascii());
    Split {
        rest: Some(text),
        sep,
    }
}

/// The lines of `text`, as `str::lines` gives them: split at `\n`, one `\r` before it
/// dropped, no empty line after a final `\n`.
pub fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut pieces = split(text, b'\n');
    std::iter::from_fn(move || {
        let piece = pieces.next()?;
        match pieces.rest {
            // The last piece ended no line: it is one only if it holds something.
            None => (!piece.is_empty()).then_some(piece),
            Some(_) => Some(piece.strip_suffix('\r').unwrap_or(piece)),
        }
    })
}

/// The iterator of `split`.
pub struct Split<'a> {
    /// What follows the last separator found; `None` once the last piece was given.
    rest: Option<&'a str>,
    sep: u8,
}

impl<'a> Split<'a> {
    /// Everything after the pieces given so far, separators included (`None` when the
    /// last piece was given).
    pub fn rest(&self) -> Option<&'a str> {
        self.rest
    }
}

impl<'a> Iterator for Split<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        match rest.bytes().position(|b| b == self.sep) {
            // An ASCII byte's neighbours are char boundaries, so both halves exist.
            Some(i) => {
                self.rest = rest.get(i + 1..);
                rest.get(..i)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXTS: [&str; 12] = [
        "",
        ",",
        ",,",
        "a",
        "a,",
        ",a",
        "a,b",
        "a,,b",
        "é,ü,",
        "a\r\nb",
        "a\n\nb\r\n",
        "\r\n\r",
    ];

    #[test]
    fn pieces_are_those_of_str_split() {
        for text in TEXTS {
            for (sep, c) in [(b',', ','), (b'\n', '\n'), (b'\r', '\r')] {
                let ours: Vec<&str> = split(text, sep).collect();
                assert_eq!(ours, text.split(c).collect::<Vec<_>>(), "{text:?} at {c:?}");
            }
        }
    }

    #[test]
    fn lines_are_those_of_str_lines() {
        for text in TEXTS
            .iter()
            .chain(&["\n", "a\n", "a\r", "\r", "a\r\r\n", "\n\n"])
        {
            let ours: Vec<&str> = lines(text).collect();
            assert_eq!(ours, text.lines().collect::<Vec<_>>(), "{text:?}");
        }
    }

    #[test]
    fn the_rest_is_what_follows_the_pieces_given() {
        let mut s = split("rl:rule:a:b", b':');
        assert_eq!((s.next(), s.next()), (Some("rl"), Some("rule")));
        assert_eq!(s.rest(), Some("a:b"));
        let mut s = split("rl", b':');
        assert_eq!((s.next(), s.rest()), (Some("rl"), None));
    }
}
