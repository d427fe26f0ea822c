//! What a reader found at its paths: the counts, and everything that says they cannot be
//! trusted to be the whole story. Kept apart from the scanner that fills it, which is about
//! the grammar; this is about what the caller may conclude.

use super::key::MAX_TEXT_LEN;

/// What a text path held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text<'a> {
    /// Nothing, or `null`.
    Absent,
    /// A string, as decoded (any bytes but those of a non-ASCII `\u` escape).
    Str(&'a [u8]),
    /// `true` or `false` (a request's `stream`).
    Bool(bool),
    /// Something else (a number, an object, an array), or a string this reader does not
    /// keep (longer than `MAX_TEXT_LEN`, or with a non-ASCII `\u` escape).
    Unreadable,
}

/// What one text path held: `text`'s room is made with the reader, so recording a string
/// allocates nothing.
#[derive(Debug)]
struct Held {
    kind: Kind,
    text: Vec<u8>,
}

/// `Text` without the string, which `Held::text` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Absent,
    Str,
    Bool(bool),
    Unreadable,
}

/// The counts at each path, and the marks of a reading that cannot be trusted whole.
#[derive(Debug)]
pub(super) struct Found {
    /// The last usable count at each path (a later value, the next event's, replaces
    /// it), then the largest at each path, whichever value it was in: one allocation.
    counts: Vec<Option<u64>>,
    /// The number of paths.
    paths: usize,
    /// What each text path held, by its index among the text paths (which come last).
    texts: Vec<Held>,
    /// The index of the first text path.
    first_text: usize,
    /// A path held something other than a usable count or `null`.
    poisoned: bool,
    /// A value opened an object at its root and did not close it well formed: whatever
    /// followed in it, the usage included, may have been lost.
    broken: bool,
    /// A key on a path came twice in one object, or (in a request's body) in a form that
    /// only Go's reader takes for the path's: parsers disagree on which one counts.
    repeated: bool,
}

impl Found {
    /// A reading of `paths` paths, those from `first_text` on text paths.
    pub(super) fn new(paths: usize, first_text: usize) -> Found {
        let held = |_| Held {
            kind: Kind::Absent,
            text: Vec::with_capacity(MAX_TEXT_LEN),
        };
        Found {
            counts: vec![None; 2 * paths],
            paths,
            texts: (first_text..paths).map(held).collect(),
            first_text,
            poisoned: false,
            broken: false,
            repeated: false,
        }
    }

    /// A number ended at the paths of `mask`: `count` if it is a usable one.
    pub(super) fn record(&mut self, mask: u16, count: Option<u64>) {
        let Some(count) = count else {
            self.poisoned = true;
            return;
        };
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            if index < self.paths {
                if let Some(value) = self.counts.get_mut(index) {
                    *value = Some(count);
                }
                if let Some(largest) = self.counts.get_mut(self.paths + index) {
                    *largest = (*largest).max(Some(count));
                }
            }
            rest &= rest - 1;
        }
    }

    /// A string ended at the text paths of `mask`: `text` if it was kept.
    pub(super) fn record_text(&mut self, mask: u16, text: Option<&[u8]>) {
        let kind = text.map_or(Kind::Unreadable, |_| Kind::Str);
        self.hold(mask, kind, text.unwrap_or_default());
    }

    /// `true` or `false` (`value`) at the text paths of `mask`.
    pub(super) fn record_bool(&mut self, mask: u16, value: bool) {
        self.hold(mask, Kind::Bool(value), &[]);
    }

    /// Something other than a string or a boolean at the text paths of `mask`.
    pub(super) fn not_a_text(&mut self, mask: u16) {
        self.hold(mask, Kind::Unreadable, &[]);
    }

    fn hold(&mut self, mask: u16, kind: Kind, text: &[u8]) {
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            let held = index
                .checked_sub(self.first_text)
                .and_then(|i| self.texts.get_mut(i));
            if let Some(held) = held {
                held.kind = kind;
                held.text.clear();
                held.text.extend_from_slice(text);
            }
            rest &= rest - 1;
        }
    }

    /// What the `index`th text path held last.
    pub(super) fn text(&self, index: usize) -> Text<'_> {
        let Some(held) = self.texts.get(index) else {
            return Text::Absent;
        };
        match held.kind {
            Kind::Absent => Text::Absent,
            Kind::Str => Text::Str(&held.text),
            Kind::Bool(value) => Text::Bool(value),
            Kind::Unreadable => Text::Unreadable,
        }
    }

    pub(super) fn poison(&mut self) {
        self.poisoned = true;
    }

    pub(super) fn break_off(&mut self) {
        self.broken = true;
    }

    pub(super) fn repeat(&mut self) {
        self.repeated = true;
    }

    pub(super) fn values(&self) -> &[Option<u64>] {
        self.counts.get(..self.paths).unwrap_or_default()
    }

    pub(super) fn largest(&self) -> &[Option<u64>] {
        self.counts.get(self.paths..).unwrap_or_default()
    }

    pub(super) fn poisoned(&self) -> bool {
        self.poisoned
    }

    pub(super) fn broken(&self) -> bool {
        self.broken
    }

    pub(super) fn repeated(&self) -> bool {
        self.repeated
    }
}
