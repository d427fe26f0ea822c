//! The brackets of a JSON container the scanner skips (one no path leads into): all it
//! follows there, with the strings, to know where the container ends.

/// The skipped brackets still open, and of their first 64 levels which are objects' (bit
/// `i` for level `i`): a close must match its open, or the structure around is misread.
#[derive(Debug, Default)]
pub(super) struct Brackets {
    open: u64,
    objects: u64,
}

/// What a closing bracket did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Close {
    /// Closed a bracket inside: the container goes on.
    Inside,
    /// Closed the container.
    Done,
    /// Closed a bracket of the other kind.
    Mismatched,
}

impl Brackets {
    /// A skipped container opens, its first bracket an object's or not.
    pub(super) fn start(&mut self, object: bool) {
        self.open = 0;
        self.bracket(object);
    }

    /// A bracket opens inside.
    pub(super) fn bracket(&mut self, object: bool) {
        let level = u32::try_from(self.open).ok();
        if let Some(bit) = level.and_then(|n| 1u64.checked_shl(n)) {
            match object {
                true => self.objects |= bit,
                false => self.objects &= !bit,
            }
        }
        self.open = self.open.saturating_add(1);
    }

    /// A bracket closes, an object's or not.
    pub(super) fn close(&mut self, object: bool) -> Close {
        self.open = self.open.saturating_sub(1);
        let level = u32::try_from(self.open).ok();
        let opened = level.and_then(|n| self.objects.checked_shr(n));
        match opened {
            Some(bits) if (bits & 1 != 0) != object => Close::Mismatched,
            _ if self.open == 0 => Close::Done,
            _ => Close::Inside,
        }
    }
}

/// Where the next string or bracket is in `bytes` from `i` on (`bytes.len()` if nowhere).
pub(super) fn next(bytes: &[u8], i: usize) -> usize {
    let rest = bytes.get(i..).unwrap_or_default();
    let run = rest
        .iter()
        .position(|&b| matches!(b, b'"' | b'[' | b']' | b'{' | b'}'));
    i + run.unwrap_or(rest.len())
}
