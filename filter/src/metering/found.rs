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
    /// Something a reader of a string does not take for one (a number, `true`, an object),
    /// or a string this reader does not keep (longer than `MAX_TEXT_LEN`, or with a
    /// non-ASCII `\u` escape).
    Unreadable,
}

/// What one text path held: `text`'s room is made with the reader, so recording a string
/// allocates nothing.
#[derive(Debug)]
struct Held {
    /// `None`: nothing yet; `Some(true)`: a string, `text`; `Some(false)`: unreadable.
    state: Option<bool>,
    text: Vec<u8>,
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
    /// A key on a path came twice in one object: parsers disagree on which one counts.
    repeated: bool,
}

impl Found {
    /// A reading of `paths` paths, those from `first_text` on text paths.
    pub(super) fn new(paths: usize, first_text: usize) -> Found {
        let held = |_| Held {
            state: None,
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
        let mut rest = mask;
        while rest != 0 {
            let index = rest.trailing_zeros() as usize;
            let held = index
                .checked_sub(self.first_text)
                .and_then(|i| self.texts.get_mut(i));
            if let Some(held) = held {
                held.text.clear();
                held.state = Some(text.is_some());
                if let Some(text) = text {
                    held.text.extend_from_slice(text);
                }
            }
            rest &= rest - 1;
        }
    }

    /// Something other than a string at the text paths of `mask`.
    pub(super) fn not_a_text(&mut self, mask: u16) {
        self.record_text(mask, None);
    }

    /// What the `index`th text path held last.
    pub(super) fn text(&self, index: usize) -> Text<'_> {
        match self
            .texts
            .get(index)
            .and_then(|h| Some((h.state?, &h.text)))
        {
            None => Text::Absent,
            Some((true, text)) => Text::Str(text),
            Some((false, _)) => Text::Unreadable,
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
