//! What a reader found at its paths: the counts, and everything that says they cannot be
//! trusted to be the whole story. Kept apart from the scanner that fills it, which is about
//! the grammar; this is about what the caller may conclude.

/// The counts at each path, and the marks of a reading that cannot be trusted whole.
#[derive(Debug)]
pub(super) struct Found {
    /// The last usable count at each path (a later value, the next event's, replaces
    /// it), then the largest at each path, whichever value it was in: one allocation.
    counts: Vec<Option<u64>>,
    /// The number of paths.
    paths: usize,
    /// A path held something other than a usable count or `null`.
    poisoned: bool,
    /// A value opened an object at its root and did not close it well formed: whatever
    /// followed in it, the usage included, may have been lost.
    broken: bool,
    /// A key on a path came twice in one object: parsers disagree on which one counts.
    repeated: bool,
}

impl Found {
    pub(super) fn new(paths: usize) -> Found {
        Found {
            counts: vec![None; 2 * paths],
            paths,
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
