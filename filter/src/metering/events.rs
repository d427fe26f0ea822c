//! Server-sent events framing (`text/event-stream`, the WHATWG rules): lines, fields and
//! events, each event's `data` handed to the JSON scanner as one value.
//!
//! A streamed LLM response is a run of events whose data is JSON (`data: {...}`), the
//! usage in one of them. Rather than gather an event's data and parse it, the framer
//! passes the data bytes of each line straight to the scanner as they arrive, a line
//! ending as the `\n` that joins an event's data lines, and resets the scanner at each
//! blank line: one event's malformed data (`[DONE]`, a truncated chunk) is then lost
//! only until the event ends. The rest of a line is never kept, so a line of any length
//! costs nothing, and the state between chunks is only where in a line the framer is.
//!
//! It also notes an event whose data is `[DONE]`, OpenAI's last: a stream that said it is
//! done reports nothing more, and OpenAI's SDKs close the connection on reading it, often
//! before the HTTP stream's own end reaches the gateway.

use super::find;
use super::json::Scanner;

/// Where in a line the framer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the stream's start: how many bytes of a UTF-8 byte order mark were read.
    Bom(u8),
    /// At a line's start.
    Start,
    /// At a line's start, the previous line ended by `\r`: a `\n` now is that end's.
    StartAfterCr,
    /// In a field's name, its first bytes those of `data`: how many.
    Field(u8),
    /// After `data:`: an optional space.
    DataStart,
    /// In a `data` field's value.
    Data,
    /// In a line of no interest: a comment, another field, a malformed line.
    Ignore,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";
const DATA: &[u8] = b"data";
const DATA_COLON: &[u8] = b"data:";
/// The data of OpenAI's last event.
const DONE: &[u8] = b"[DONE]";
/// `Framer::done_at` when the event's data is not `DONE`.
const ELSE: u8 = u8::MAX;

#[derive(Debug)]
pub(super) struct Framer {
    line: Line,
    /// The data line being read began in the chunk being read: it may be judged whole.
    whole: bool,
    /// The event being read has a data line.
    has_data: bool,
    /// How many bytes of `DONE` the event's data has spelled so far; `ELSE` once it
    /// spells something else (a byte, so that the reader keeps its size).
    done_at: u8,
    /// An event whose data was `DONE` ended.
    done: bool,
}

/// Where the line of `bytes` ends (its length if it does not), and whether a backslash
/// comes before: one pass for both.
fn line_end(bytes: &[u8]) -> (usize, bool) {
    let first = find::first_of(bytes, [b'\n', b'\r', b'\\']);
    match bytes.get(first) {
        Some(b'\\') => {
            let rest = bytes.get(first..).unwrap_or_default();
            (first + find::first_of(rest, [b'\n', b'\r']), true)
        }
        _ => (first, false),
    }
}

fn is_eol(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// Whether `after`, what follows a line's text, ends its line and then the event (a blank
/// line), in any of the line ends.
fn ends_event(after: &[u8]) -> bool {
    let rest = match after {
        [b'\r', b'\n', rest @ ..] | [b'\n' | b'\r', rest @ ..] => rest,
        _ => return false,
    };
    matches!(rest.first(), Some(b'\n' | b'\r'))
}

impl Framer {
    pub(super) fn new() -> Framer {
        Framer {
            line: Line::Bom(0),
            whole: false,
            has_data: false,
            done_at: 0,
            done: false,
        }
    }

    /// Whether an event whose data was `[DONE]` ended.
    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// Whether an event with data has begun and not ended: a reader dispatches an event
    /// at its blank line only, so one the body ends inside never reaches the client.
    pub(super) fn pending(&self) -> bool {
        self.has_data
    }

    /// A data line begins: a second one in an event joins the data with a line feed.
    fn data_line(&mut self) {
        if self.has_data {
            self.done_at = ELSE;
        }
        self.has_data = true;
    }

    /// More of the event's data.
    fn spell(&mut self, data: &[u8]) {
        let at = usize::from(self.done_at);
        let end = at.saturating_add(data.len());
        self.done_at = match DONE.get(at..end) == Some(data) {
            true => u8::try_from(end).unwrap_or(ELSE),
            false => ELSE,
        };
    }

    /// A blank line: the event ends.
    fn end_event(&mut self) {
        self.done |= self.has_data && usize::from(self.done_at) == DONE.len();
        self.has_data = false;
        self.done_at = 0;
    }

    pub(super) fn feed(&mut self, bytes: &[u8], json: &mut Scanner) {
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            if let Line::Data | Line::Ignore = self.line {
                // The run up to the line's end, at once: data to the scanner, the rest
                // nowhere.
                let rest = bytes.get(i..).unwrap_or_default();
                let (run, escaped) = line_end(rest);
                let data = rest.get(..run).unwrap_or_default();
                if self.line == Line::Data {
                    self.spell(data);
                }
                // An event whose data is this one line, as LLM APIs send it, and where no
                // path can have a value, is passed over at once: most events carry none of
                // the usage. (An escape may spell a key: such a line is read.)
                let alone =
                    self.whole && !escaped && ends_event(rest.get(run..).unwrap_or_default());
                if self.line == Line::Data && !json.failed() && !(alone && json.passes_over(data)) {
                    json.feed(data);
                }
                self.whole = false;
                i += run;
                let Some(&eol) = bytes.get(i) else { return };
                if self.line == Line::Data {
                    json.feed(b"\n");
                }
                self.end_line(eol);
                i += 1;
            } else if matches!(self.line, Line::Start | Line::StartAfterCr)
                && bytes.get(i..i + 5) == Some(DATA_COLON)
            {
                // The usual line, its field name at once.
                self.line = Line::DataStart;
                self.data_line();
                i += 5;
            } else if self.step(b, json) {
                i += 1;
            }
        }
    }

    /// One byte outside a line's value; false when it was not taken and must be read
    /// again in the new state.
    fn step(&mut self, b: u8, json: &mut Scanner) -> bool {
        match self.line {
            Line::Bom(at) => match BOM.get(usize::from(at)) {
                Some(&expected) if expected == b => {
                    let at = at + 1;
                    self.line = match usize::from(at) == BOM.len() {
                        true => Line::Start,
                        false => Line::Bom(at),
                    };
                }
                // A partial mark starts a line that names no field anyone reads.
                _ => {
                    self.line = if at == 0 { Line::Start } else { Line::Ignore };
                    return false;
                }
            },
            Line::StartAfterCr if b == b'\n' => self.line = Line::Start,
            Line::Start | Line::StartAfterCr => match b {
                b'\n' | b'\r' => {
                    // A blank line: the event ends, and with it its data's value.
                    json.reset();
                    self.end_event();
                    self.end_line(b);
                }
                b'd' => self.line = Line::Field(1),
                _ => self.line = Line::Ignore,
            },
            Line::Field(at) => match DATA.get(usize::from(at)) {
                Some(&expected) if expected == b => self.line = Line::Field(at + 1),
                None if b == b':' => {
                    self.line = Line::DataStart;
                    self.data_line();
                }
                // `data` alone on its line: a data line with an empty value.
                None if is_eol(b) => {
                    self.data_line();
                    json.feed(b"\n");
                    self.end_line(b);
                }
                _ if is_eol(b) => self.end_line(b),
                _ => self.line = Line::Ignore,
            },
            Line::DataStart => {
                self.line = Line::Data;
                self.whole = true;
                return b == b' ';
            }
            // `feed` reads these a run at a time; a byte at a time, the same.
            Line::Data if is_eol(b) => {
                json.feed(b"\n");
                self.end_line(b);
            }
            Line::Data => {
                self.spell(&[b]);
                json.feed(&[b]);
            }
            Line::Ignore if is_eol(b) => self.end_line(b),
            Line::Ignore => {}
        }
        true
    }

    fn end_line(&mut self, eol: u8) {
        self.line = match eol {
            b'\r' => Line::StartAfterCr,
            _ => Line::Start,
        };
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
