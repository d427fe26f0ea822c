//! The field paths a metered rule reads, compiled once per reader into bit masks.
//!
//! The scanner follows a body byte by byte and must know, at every object it enters,
//! which paths can still match below it. With at most 16 paths that set is one `u16`, so
//! descending, matching a key and deciding whether a value ends a path are a few bit
//! operations, and a key is compared only with the segments of the paths still in play.
//!
//! Go's `encoding/json` (Ollama, LocalAI and other Go upstreams) matches a key to a field
//! case-insensitively, the last match winning, where Python, JavaScript and serde_json
//! match exactly: `{"Model": "x"}` names `model` for Go alone. So in a request's body,
//! which an upstream parses after the gateway, a key is compared both ways, and one that
//! only Go takes for a segment (`folded`) is the caller's to distrust. A response's keys
//! are the upstream's own writing, read by the gateway alone: compared exactly, as the
//! event framer's fast path (`may_hold`) finds them.
//!
//! A path the reader cannot match (beyond the 16th, empty, longer than 8 segments) is not
//! refused here, where there is no one to tell: it keeps its place in `values` and never
//! matches. The configuration is where such a path is refused.

use super::find;

/// Most paths a reader matches; the others are never found.
pub const MAX_PATHS: usize = 16;
/// Most segments in a path; a longer path is never found.
pub const MAX_SEGMENTS: usize = 8;
/// Longest key compared, in bytes as decoded: a longer key, and a path with a longer
/// segment, never match.
pub const MAX_KEY_LEN: usize = 64;

/// The paths, and for each segment index which paths end there.
#[derive(Debug)]
pub(super) struct Paths {
    segments: Vec<Vec<String>>,
    /// The paths that can match at all.
    usable: u16,
    /// `last[d]`: the usable paths whose final segment is segment `d`.
    last: [u16; MAX_SEGMENTS],
    /// Usable paths whose first segment no usable path before them has: each first
    /// segment once.
    firsts: u16,
    /// The paths whose value is a string (a text), not a count.
    texts: u16,
    /// Keys are also compared as Go folds them (`folded`): a request's body.
    fold: bool,
}

impl Paths {
    /// `segments`, those from index `first_text` on text paths; `fold`: keys Go alone takes
    /// for a segment are found too (`folded`).
    pub(super) fn new(segments: Vec<Vec<String>>, first_text: usize, fold: bool) -> Paths {
        let mut usable = 0u16;
        let mut last = [0u16; MAX_SEGMENTS];
        for (index, path) in segments.iter().enumerate().take(MAX_PATHS) {
            let bit = 1u16 << index;
            let fits = path.iter().all(|s| s.len() <= MAX_KEY_LEN);
            match path.len().checked_sub(1).and_then(|d| last.get_mut(d)) {
                Some(ends_here) if fits => {
                    *ends_here |= bit;
                    usable |= bit;
                }
                _ => {}
            }
        }
        let first = |index: usize| segments.get(index).and_then(|p| p.first());
        let firsts = (0..MAX_PATHS)
            .filter(|&i| usable & (1 << i) != 0)
            .filter(|&i| (0..i).all(|j| usable & (1 << j) == 0 || first(j) != first(i)))
            .fold(0u16, |mask, i| mask | 1 << i);
        let texts = (first_text..MAX_PATHS).fold(0u16, |mask, i| mask | 1 << i) & usable;
        Paths {
            segments,
            usable,
            last,
            firsts,
            texts,
            fold,
        }
    }

    /// The text paths.
    pub(super) fn texts(&self) -> u16 {
        self.texts
    }

    /// How many paths were given, usable or not: the length of `values`.
    pub(super) fn len(&self) -> usize {
        self.segments.len()
    }

    /// The paths an object at the root is searched for.
    pub(super) fn usable(&self) -> u16 {
        self.usable
    }

    /// Whether a JSON text with no backslash (every key written as it reads: the framer,
    /// which finds where the text ends, knows) may hold a value at a path, by its bytes
    /// alone: false only when every key that is a usable path's first segment has the
    /// value `null`, which is no value at all. No string has a quote in it then, so
    /// `"usage"` is a key or the string "usage", which a `,` or a bracket follows.
    pub(super) fn may_hold(&self, text: &[u8]) -> bool {
        let mut firsts = self.firsts;
        while firsts != 0 {
            let index = firsts.trailing_zeros() as usize;
            firsts &= firsts - 1;
            let Some(name) = self.segments.get(index).and_then(|p| p.first()) else {
                continue;
            };
            let (name, mut at) = (name.as_bytes(), 0);
            let first = name.first().copied().unwrap_or(b'"');
            while let Some(rest) = text.get(at..).filter(|rest| rest.len() > 1) {
                let quote = find::pair(rest, b'"', first);
                let Some(key) = rest.get(quote + 1..) else {
                    break;
                };
                at += quote + 1;
                if key.get(..name.len()) != Some(name) || key.get(name.len()) != Some(&b'"') {
                    continue;
                }
                // A key's value, unless null; the string ends a value where a `,` or a
                // bracket follows.
                let after = key.get(name.len() + 1..).unwrap_or_default();
                let value = !matches!(after.first(), Some(b',' | b'}' | b']'));
                if value && !after.starts_with(b":null") {
                    return true;
                }
            }
        }
        false
    }

    /// The paths whose final segment is segment `level`.
    pub(super) fn last(&self, level: usize) -> u16 {
        self.last.get(level).copied().unwrap_or(0)
    }

    /// Of `candidates`, the paths whose segment `level` is `key`.
    pub(super) fn hits(&self, candidates: u16, level: usize, key: &[u8]) -> u16 {
        self.matching(candidates, level, |segment| segment == key)
    }

    /// Of `candidates`, the paths whose segment `level` Go's JSON reader takes `key` for
    /// (`go_fold`), exactly or not; none unless the paths fold.
    pub(super) fn folded(&self, candidates: u16, level: usize, key: &[u8]) -> u16 {
        match self.fold {
            true => self.matching(candidates, level, |segment| go_fold(key, segment)),
            false => 0,
        }
    }

    fn matching(&self, candidates: u16, level: usize, is: impl Fn(&[u8]) -> bool) -> u16 {
        let mut hits = 0;
        let mut rest = candidates;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            let segment = self.segments.get(index).and_then(|p| p.get(level));
            if segment.is_some_and(|s| is(s.as_bytes())) {
                hits |= 1 << index;
            }
            rest &= rest - 1;
        }
        hits
    }
}

/// Whether Go's `encoding/json` takes the key `key` (as decoded) for a field named `segment`
/// (ASCII, as the configuration has it): equal once both are folded as Go folds a name
/// (ASCII letters to upper case, any other character to `ToUpper(ToLower(c))`). The only
/// characters beyond ASCII that fold into it are `İ` and `ı` (to `I`), `ſ` (to `S`) and
/// the Kelvin sign `K` (to `K`); any other matches no ASCII segment.
pub(super) fn go_fold(key: &[u8], segment: &[u8]) -> bool {
    let Ok(key) = std::str::from_utf8(key) else {
        return false;
    };
    let mut want = segment.iter();
    for c in key.chars() {
        let folded = match c {
            '\u{130}' | '\u{131}' => b'I',
            '\u{17f}' => b'S',
            '\u{212a}' => b'K',
            c if c.is_ascii() => u8::try_from(c).unwrap_or(0).to_ascii_uppercase(),
            _ => return false,
        };
        if want.next().map(u8::to_ascii_uppercase) != Some(folded) {
            return false;
        }
    }
    want.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&[&str]]) -> Paths {
        Paths::new(
            list.iter()
                .map(|p| p.iter().map(|s| s.to_string()).collect())
                .collect(),
            MAX_PATHS,
            true,
        )
    }

    #[test]
    fn only_a_text_where_each_first_segment_is_a_key_of_null_holds_nothing() {
        let p = paths(&[&["usage", "prompt_tokens"], &["message", "usage", "x"]]);
        for nothing in [
            &br#"{"id":"c-1","choices":[{"delta":{"content":"usage"}}],"usage":null}"#[..],
            br#"{"type":"ping"}"#,
            br#"{"message":null,"usage":null}"#,
            b"[DONE]",
            b"",
        ] {
            assert!(!p.may_hold(nothing), "{}", String::from_utf8_lossy(nothing));
        }
        for something in [
            &br#"{"usage":{"prompt_tokens":1}}"#[..],
            br#"{"usage" : null}"#,
            br#"{"usage":nul"#,
            br#"{"message":{"usage":null}}"#,
            br#"{"usage""#,
            br#"{"usage" :null}"#,
        ] {
            assert!(
                p.may_hold(something),
                "{}",
                String::from_utf8_lossy(something)
            );
        }
        assert!(paths(&[&["total"]]).may_hold(br#"{"total":5}"#));
    }

    #[test]
    fn each_path_ends_at_its_last_segment_and_matches_only_its_own_keys() {
        let p = paths(&[&["usage", "prompt_tokens"], &["usage"], &["usage", "x"]]);
        assert_eq!(p.usable(), 0b111);
        assert_eq!(p.last(0), 0b010);
        assert_eq!(p.last(1), 0b101);
        assert_eq!(p.hits(0b111, 0, b"usage"), 0b111);
        assert_eq!(p.hits(0b101, 1, b"prompt_tokens"), 0b001);
        assert_eq!(p.hits(0b101, 1, b"prompt_tokens2"), 0);
        assert_eq!(
            p.hits(0b010, 1, b"prompt_tokens"),
            0,
            "usage has no segment 1"
        );
    }

    #[test]
    fn go_takes_a_key_in_any_case_and_four_characters_beyond_ascii_for_a_field() {
        for key in [
            "max_tokens",
            "MAX_TOKENS",
            "Max_Tokens",
            "max_to\u{212a}en\u{17f}",
        ] {
            assert!(go_fold(key.as_bytes(), b"max_tokens"), "{key}");
        }
        assert!(go_fold("\u{130}D".as_bytes(), b"id"));
        assert!(go_fold("\u{131}d".as_bytes(), b"ID"));
        for key in [
            "max_token",
            "max_tokens_",
            "m\u{e1}x_tokens",
            "max-tokens",
            "",
        ] {
            assert!(!go_fold(key.as_bytes(), b"max_tokens"), "{key}");
        }
        assert!(!go_fold(b"\xffodel", b"model"), "not UTF-8");
        let p = paths(&[&["model"], &["usage", "model"]]);
        assert_eq!(p.folded(0b11, 0, b"MODEL"), 0b01);
        assert_eq!(p.hits(0b11, 0, b"MODEL"), 0);
    }

    #[test]
    fn paths_beyond_the_bounds_keep_their_place_but_are_never_usable() {
        let long_key = "k".repeat(MAX_KEY_LEN + 1);
        let nine: Vec<&str> = vec!["a"; MAX_SEGMENTS + 1];
        let long = [long_key.as_str()];
        let mut list: Vec<&[&str]> = vec![&[], &nine, &long, &["ok"]];
        let many: Vec<[&str; 1]> = (0..20).map(|_| ["x"]).collect();
        list.extend(many.iter().map(|p| &p[..]));
        let p = paths(&list);
        assert_eq!(p.len(), 24);
        assert_eq!(p.usable() & 0b1111, 0b1000);
        assert_eq!(p.usable().count_ones() as usize, MAX_PATHS - 3);
        assert_eq!(
            p.hits(u16::MAX, 0, b"x").count_ones() as usize,
            MAX_PATHS - 4
        );
    }
}
