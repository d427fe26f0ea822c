//! A streaming JSON scanner: follows one JSON value byte by byte, in whatever pieces it
//! comes, and records the numbers found at the configured paths (and the strings, at the
//! text paths).
//!
//! Nothing of the body is kept: the state is a fixed handful of fields (a key of at most
//! `KEY_ROOM` bytes, or a text of `MAX_TEXT_LEN`, a number's digits as they add up, a stack of
//! `MAX_DEPTH` open containers as bits), so a body of any size, a string or a number of any
//! length, costs the same memory, and a chunk boundary can fall anywhere because every
//! byte's meaning is carried in that state.
//!
//! What usually comes together is read together when the chunk holds it: a string's text
//! a run at a time (`find`), a key's closing quote with its colon, a comma with the next
//! key's quote, `null` whole, a number's digits in one loop; at a chunk's edge, the same
//! steps a byte at a time.
//!
//! It checks the grammar (RFC 8259) as a strict parser does, in containers no path leads
//! into as well (a raw control character in a string included): a value malformed
//! anywhere is refused by the client's own parser, so a count read from it would be one
//! the client never saw (invalid UTF-8 is `utf8`'s to find). A stream's content events,
//! where no path can be, are mostly passed over unread (`passes_over`). Only below
//! `MAX_DEPTH` are brackets and strings alone followed, a run at a time, until the
//! container closes: that is all it takes to know where it ends, and the values after it
//! are still read.

use super::find;
use super::found::Found;
use super::key::{Escape, Key, KEY_ROOM, MAX_TEXT_LEN};
use super::number::{Next, Number};
use super::paths::{Paths, MAX_SEGMENTS};
use super::skip::{self, Brackets, Close};

/// Containers followed in full; deeper, only their brackets are counted.
const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value, whitespace before it: the root, after `:`, after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    FirstElement,
    /// After `{`: a key or `}`.
    FirstKey,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value in a container: `,` or the container's close.
    AfterValue,
    /// Inside a string, of the kind `kind` says.
    Str,
    /// After a backslash in a string.
    Escape,
    /// In a `\u` escape: how many hex digits are still to come.
    Unicode(u8),
    /// Inside `true`, `false` or `null` (an index in `WORDS`): how many bytes were read.
    Literal(u8, u8),
    /// Inside a number, `number`.
    Number,
    /// Inside a container no path leads into, its brackets in `skipped`.
    Skip,
    /// The root value is complete: only whitespace may follow.
    Done,
    /// Malformed: nothing more is read until `reset`.
    Failed,
}

/// What a string is: a key is compared with the paths, a string value ends a value, a
/// string inside a skipped value ends nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrKind {
    Key,
    Value,
    Skipped,
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];
const NULL: u8 = 2;

/// One JSON value's scanner, and what it found at the paths (kept across `reset`).
#[derive(Debug)]
pub(super) struct Scanner {
    paths: Paths,
    found: Found,
    /// This value began as an object (broken if it does not close, once `touched`).
    root_object: bool,
    /// A value began at a path, or at a key leading to one, and was not `null`: a value
    /// cut short from here may have lost a count. (Before that, nothing at a path was
    /// lost: an event the framer passes over unread, its keys on paths all `null`, never
    /// gets here, and must read the same whether it is read or passed over.)
    touched: bool,
    /// `seen[l]`: the paths whose segment `l` was a key of this value already.
    seen: [u16; MAX_SEGMENTS],
    state: State,
    kind: StrKind,
    /// Open containers, at most `MAX_DEPTH`; bit `i` of `objects` set when the `i`th is an
    /// object, `masks[i]` the paths its keys are compared with (none below `MAX_SEGMENTS`).
    depth: usize,
    objects: u32,
    masks: [u16; MAX_SEGMENTS],
    /// The paths ending at the value being read; those going on below it, should it be an
    /// object.
    exact: u16,
    deeper: u16,
    key: Key,
    number: Number,
    skipped: Brackets,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Scanner {
    /// A scanner of `paths`, those from index `first_text` on text paths.
    pub(super) fn new(paths: Paths, first_text: usize) -> Scanner {
        let deeper = paths.usable();
        let room = match paths.texts() {
            0 => KEY_ROOM,
            _ => MAX_TEXT_LEN.max(KEY_ROOM),
        };
        Scanner {
            found: Found::new(paths.len(), first_text),
            paths,
            root_object: false,
            touched: false,
            seen: [0; MAX_SEGMENTS],
            state: State::Value,
            kind: StrKind::Value,
            depth: 0,
            objects: 0,
            masks: [0; MAX_SEGMENTS],
            exact: 0,
            deeper,
            key: Key::new(room),
            number: Number::new(),
            skipped: Brackets::default(),
        }
    }

    /// Ready for a new value (an event's), keeping what was recorded.
    pub(super) fn reset(&mut self) {
        self.end();
        self.state = State::Value;
        self.depth = 0;
        self.exact = 0;
        self.deeper = self.paths.usable();
        self.root_object = false;
        self.touched = false;
        self.seen = [0; MAX_SEGMENTS];
    }

    /// The value's input ended: an object it opened at its root must have closed, if a
    /// value on a path began in it.
    fn end(&mut self) {
        if self.root_object && self.touched && self.state != State::Done {
            self.found.break_off();
        }
    }

    /// The value's event was never dispatched (the body ended inside it): a value begun at
    /// a path is one no reader saw, so what was read cannot be the whole story.
    pub(super) fn undispatched(&mut self) {
        if self.touched {
            self.found.break_off();
        }
    }

    pub(super) fn found(&self) -> &Found {
        &self.found
    }

    /// True before a value has begun if `text`, all of it and without a backslash, can
    /// hold no value at a path (`Paths::may_hold`).
    pub(super) fn passes_over(&self, text: &[u8]) -> bool {
        self.state == State::Value && self.depth == 0 && !self.paths.may_hold(text)
    }

    /// True once the value began as an object.
    pub(super) fn began_object(&self) -> bool {
        self.root_object
    }

    /// True once the value is malformed: the rest is not read.
    pub(super) fn failed(&self) -> bool {
        self.state == State::Failed
    }

    /// True once the value has closed, well formed (whitespace may follow).
    pub(super) fn closed(&self) -> bool {
        self.state == State::Done
    }

    /// The input ended: a number still pending is complete.
    pub(super) fn finish(&mut self) {
        if self.state == State::Number && self.number.complete() {
            self.end_number();
        }
        self.end();
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            i = match self.state {
                State::Failed => return,
                State::Str => self.string(bytes, i),
                State::Number => self.number(bytes, i),
                // In a skipped container, up to its next string or bracket at once.
                State::Skip => self.step(bytes, skip::next(bytes, i)),
                _ => self.step(bytes, i),
            };
        }
    }

    /// Reads on from `bytes[i]`, one byte or a few that usually come together; where to
    /// read on from.
    fn step(&mut self, bytes: &[u8], i: usize) -> usize {
        let Some(&b) = bytes.get(i) else {
            return bytes.len();
        };
        match self.state {
            State::Value => return self.value(bytes, i),
            State::FirstElement if b == b']' => self.close(b),
            State::FirstElement => return self.value(bytes, i),
            State::FirstKey if b == b'}' => self.close(b),
            State::FirstKey | State::Key if b == b'"' => {
                self.start_key();
                return self.string(bytes, i + 1);
            }
            State::FirstKey | State::Key | State::Colon if is_space(b) => {}
            State::Colon if b == b':' => self.state = State::Value,
            State::FirstKey | State::Key | State::Colon => self.fail(),
            State::AfterValue => match b {
                b',' if self.top_is_object() => {
                    if bytes.get(i + 1) == Some(&b'"') {
                        self.start_key();
                        return self.string(bytes, i + 2);
                    }
                    self.state = State::Key;
                }
                b',' => self.state = State::Value,
                b']' | b'}' => self.close(b),
                _ if is_space(b) => {}
                _ => self.fail(),
            },
            State::Str => return self.string(bytes, i),
            State::Escape => match self.key.escape(b) {
                Escape::Done => self.state = State::Str,
                Escape::Unicode => self.state = State::Unicode(4),
                Escape::Malformed => self.fail(),
            },
            State::Unicode(left) if !self.key.unicode(left, b) => self.fail(),
            State::Unicode(left) if left > 1 => self.state = State::Unicode(left - 1),
            State::Unicode(_) => self.state = State::Str,
            State::Literal(word, at) => self.literal(word, at, b),
            State::Number => return self.number(bytes, i),
            State::Skip => match b {
                b'"' => self.start_string(StrKind::Skipped),
                b'[' | b'{' => self.skipped.bracket(b == b'{'),
                b']' | b'}' => match self.skipped.close(b == b'}') {
                    Close::Inside => {}
                    Close::Done => self.end_value(),
                    Close::Mismatched => self.fail(),
                },
                _ => {}
            },
            State::Done if is_space(b) => {}
            State::Done => self.fail(),
            State::Failed => return bytes.len(),
        }
        i + 1
    }

    fn fail(&mut self) {
        self.state = State::Failed;
    }

    /// A value at the paths of `exact` that is not a count, nor (unless `text`: a string
    /// or a boolean, which the caller records) a text.
    fn not_a_count(&mut self, text: bool) {
        let texts = self.exact & self.paths.texts();
        if self.exact & !texts != 0 {
            self.found.poison();
        }
        if texts != 0 && !text {
            self.found.not_a_text(texts);
        }
    }

    /// A value starting at `bytes[i]`.
    fn value(&mut self, bytes: &[u8], i: usize) -> usize {
        let Some(&b) = bytes.get(i) else {
            return bytes.len();
        };
        if self.depth > 0 && self.exact | self.deeper != 0 && b != b'n' && !is_space(b) {
            self.touched = true;
        }
        match b {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => {
                self.not_a_count(true);
                self.start_string(StrKind::Value);
                self.key.start(self.exact & self.paths.texts() != 0);
                return self.string(bytes, i + 1);
            }
            b't' | b'f' | b'n' => {
                let word = match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => NULL,
                };
                if word != NULL {
                    // A literal cut at a chunk's edge and then malformed makes the whole
                    // value malformed: what is recorded here is then not trusted.
                    self.not_a_count(true);
                    let texts = self.exact & self.paths.texts();
                    if texts != 0 {
                        self.found.record_bool(texts, word == 0);
                    }
                }
                let text = WORDS.get(usize::from(word)).copied().unwrap_or_default();
                if bytes.get(i..i + text.len()) == Some(text) {
                    self.end_value();
                    return i + text.len();
                }
                self.state = State::Literal(word, 1);
            }
            b'-' | b'0'..=b'9' => {
                self.number.start(b);
                self.state = State::Number;
                return self.number(bytes, i + 1);
            }
            _ if is_space(b) => {}
            _ => self.fail(),
        }
        i + 1
    }

    fn open(&mut self, object: bool) {
        self.not_a_count(false);
        if self.depth == 0 && object {
            self.root_object = true;
        }
        if self.depth >= MAX_DEPTH {
            self.skipped.start(object);
            self.state = State::Skip;
            return;
        }
        let bit = 1u32 << self.depth;
        if object {
            self.objects |= bit;
        } else {
            self.objects &= !bit;
        }
        if let Some(mask) = self.masks.get_mut(self.depth) {
            *mask = if object { self.deeper } else { 0 };
        }
        self.depth += 1;
        self.exact = 0;
        self.deeper = 0;
        self.state = if object {
            State::FirstKey
        } else {
            State::FirstElement
        };
    }

    fn top_is_object(&self) -> bool {
        let top = self
            .depth
            .checked_sub(1)
            .and_then(|t| u32::try_from(t).ok());
        top.and_then(|t| self.objects.checked_shr(t))
            .is_some_and(|bits| bits & 1 != 0)
    }

    fn close(&mut self, b: u8) {
        if self.depth == 0 || (b == b'}') != self.top_is_object() {
            return self.fail();
        }
        self.depth -= 1;
        self.end_value();
    }

    /// A value is complete: what follows it is its container's business.
    fn end_value(&mut self) {
        self.exact = 0;
        self.deeper = 0;
        self.state = if self.depth == 0 {
            State::Done
        } else {
            State::AfterValue
        };
    }

    /// The index of the innermost open container, whose keys are its paths' segment there.
    fn level(&self) -> Option<usize> {
        self.depth.checked_sub(1)
    }

    fn start_string(&mut self, kind: StrKind) {
        self.kind = kind;
        self.key.start(false);
        self.state = State::Str;
    }

    /// A key, kept only if a path may match it.
    fn start_key(&mut self) {
        self.kind = StrKind::Key;
        let candidates = self.level().and_then(|l| self.masks.get(l));
        self.key
            .start_name(candidates.is_some_and(|&mask| mask != 0));
        self.state = State::Str;
    }

    /// Inside a string from `bytes[i]`: its text up to a quote or a backslash at once. A
    /// raw control character is malformed, as a strict parser finds it.
    fn string(&mut self, bytes: &[u8], i: usize) -> usize {
        let rest = bytes.get(i..).unwrap_or_default();
        let run = find::string_end(rest);
        if self.key.kept() {
            self.key.push(rest.get(..run).unwrap_or_default());
        }
        let at = i + run;
        match bytes.get(at) {
            Some(b'"') if self.kind == StrKind::Key => {
                self.end_key();
                if bytes.get(at + 1) == Some(&b':') {
                    self.state = State::Value;
                    return at + 2;
                }
            }
            Some(b'"') if self.kind == StrKind::Value => {
                let texts = self.exact & self.paths.texts();
                if texts != 0 {
                    self.found.record_text(texts, self.key.get());
                }
                self.end_value();
            }
            Some(b'"') => self.state = State::Skip,
            Some(b'\\') => self.state = State::Escape,
            Some(_) => self.fail(),
            None => return at,
        }
        at + 1
    }

    /// A key is complete: the paths its value ends, and those going on below it. A key
    /// that Go's reader alone takes for a path's (`{"Model": ...}`, or a second `model` in
    /// another case) is a repeat: readers disagree on what the path holds.
    fn end_key(&mut self) {
        let level = self.level().unwrap_or(0);
        let (hits, folded) = match self.key.get() {
            Some(key) => {
                let candidates = self.masks.get(level).copied().unwrap_or(0);
                let hits = self.paths.hits(candidates, level, key);
                (hits, self.paths.folded(candidates & !hits, level, key))
            }
            None => (0, 0),
        };
        if folded != 0 {
            self.found.repeat();
        }
        let last = self.paths.last(level);
        self.exact = hits & last;
        self.deeper = hits & !last;
        // Paths go through objects only, so a key on one comes once per value unless its
        // object repeats it.
        if let Some(seen) = self.seen.get_mut(level) {
            if *seen & hits != 0 {
                self.found.repeat();
            }
            *seen |= hits;
        }
        self.state = State::Colon;
    }

    fn literal(&mut self, word: u8, at: u8, b: u8) {
        let text = WORDS.get(usize::from(word)).copied().unwrap_or_default();
        if text.get(usize::from(at)) != Some(&b) {
            return self.fail();
        }
        if usize::from(at) + 1 == text.len() {
            self.end_value();
        } else {
            self.state = State::Literal(word, at + 1);
        }
    }

    /// Inside a number from `bytes[i]`: all its digits at once.
    fn number(&mut self, bytes: &[u8], i: usize) -> usize {
        let rest = bytes.get(i..).unwrap_or_default();
        match self.number.run(rest) {
            (taken, Next::More) => i + taken,
            (taken, Next::Ended) => {
                self.end_number();
                i + taken
            }
            (_, Next::Malformed) => {
                self.fail();
                bytes.len()
            }
        }
    }

    /// A number is complete: a usable count is recorded at its count paths, anything else
    /// poisons them; at a text path, it is not a text.
    fn end_number(&mut self) {
        let texts = self.exact & self.paths.texts();
        if self.exact & !texts != 0 {
            self.found.record(self.exact & !texts, self.number.count());
        }
        if texts != 0 {
            self.found.not_a_text(texts);
        }
        self.end_value();
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
