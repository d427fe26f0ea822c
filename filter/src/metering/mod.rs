//! What a metered rule's response cost: counts read out of the upstream's response body
//! as it passes, such as an OpenAI-compatible API's `usage.prompt_tokens` and
//! `usage.completion_tokens` (a JSON body, or server-sent events when streamed) or
//! Anthropic's `message.usage.input_tokens` and `usage.output_tokens` (events). The same
//! reader reads what a request's JSON body asks to reserve (`max_tokens`).
//!
//! A layer of its own because it reads a different hostile input (a response, not a
//! request) and decides nothing: what a count costs, and what becomes of the reservation
//! made when the request was admitted, is `decision`'s. It is plain `std` Rust with no host
//! in it, so that every split of a body can be tested natively.
//!
//! The body is not held back to be read: the gateway streams each chunk on as it arrives,
//! and the reader sees it once, in passing, split anywhere. So the reader is a byte-at-a-
//! time state machine of fixed size: a body, a line or a string of any length costs no
//! memory, no allocation is made after `UsageReader::new`, and a chunk boundary inside a
//! key, a number or a `\r\n` changes nothing.
//!
//! Bottom to top: `paths` (the paths as bit masks), `find` (the next byte that matters,
//! eight at a time), `number` (a number's grammar and count), `key` (a string's escapes,
//! and the key kept of it), `json` (the scanner that follows one JSON value and records
//! what it finds at the paths), `events` (server-sent events framing, each event's data a
//! value of its own), `eventstream` (AWS's binary framing, each message's payload a value
//! of its own), `utf8` (whether the text is), and here `UsageReader`, the one thing the
//! rest of the filter uses.

mod events;
mod eventstream;
mod find;
mod found;
mod json;
mod key;
mod number;
mod paths;
mod skip;
mod utf8;

pub use found::Text;
pub use key::MAX_TEXT_LEN;
pub use number::MAX_COUNT;
pub use paths::{MAX_KEY_LEN, MAX_PATHS, MAX_SEGMENTS};

/// How a response body carries its JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// One JSON value, whitespace around it allowed (`application/json`).
    Json,
    /// Server-sent events (`text/event-stream`), each event's data one JSON value.
    EventStream,
    /// AWS's event stream (`application/vnd.amazon.eventstream`, Bedrock's
    /// `ConverseStream`), each message's payload one JSON value.
    AwsEventStream,
}

/// How the body carries its JSON values, and where in that framing the reader is.
#[derive(Debug)]
enum Framing {
    Json,
    Events(events::Framer),
    Frames(eventstream::Frames),
}

/// Reads the counts at a few field paths out of a response body, chunk by chunk.
///
/// A path names object members from the root of a JSON value, `["usage",
/// "prompt_tokens"]`; arrays are followed but never descended into. What the reader makes
/// of the body:
///
/// - A usable count is an integer from 0 to `MAX_COUNT` written without fraction or
///   exponent (`-0` is 0). It is recorded as soon as its number ends, and a later one at
///   the same path (the next event's, a duplicated key's) replaces it.
/// - `null` at a path is no value at all (OpenAI's `"usage": null` in every chunk but the
///   last). Anything else there (a negative number, `1.5`, `1e3`, a number above
///   `MAX_COUNT`, a string, `true`, `false`, an object, an array) poisons the reader: the
///   caller cannot trust the counts and keeps what it reserved. A path that a non-object
///   cuts short (`"usage": 5` for `usage.prompt_tokens`) is just not there.
/// - `BodyFormat::Json`: malformed JSON stops the reading for good; what was recorded
///   before stands. `BodyFormat::EventStream`: an event's data that is not JSON
///   (`[DONE]`) or is malformed is ignored from there to the event's end; the next event
///   starts clean.
/// - What cannot be trusted to be the whole story is said (`trusted`): a JSON body that
///   did not end well formed, an event that opened an object and did not close it, a
///   poisoned path, a key on a path that came twice in one object (`{"max_tokens": 1,
///   "max_tokens": 900}`: parsers disagree on which one counts), bytes that are not
///   UTF-8 (parsers disagree on those too). The largest count seen
///   at each path is kept too (`largest`), for a caller that must charge at least what the
///   body showed.
#[derive(Debug)]
pub struct UsageReader {
    json: json::Scanner,
    framing: Framing,
    text: utf8::Utf8,
    bytes: u64,
    /// The body's first bytes, for `foreign_encoding`.
    head: [u8; 3],
    finished: bool,
}

impl UsageReader {
    /// A reader of `paths` (at most `MAX_PATHS`, each of 1 to `MAX_SEGMENTS` segments of at
    /// most `MAX_KEY_LEN` bytes; any other path keeps its index in `values` but is never
    /// found).
    pub fn new(format: BodyFormat, paths: Vec<Vec<String>>) -> UsageReader {
        UsageReader::with_texts(format, paths, Vec::new())
    }

    /// A reader of the counts at `paths` and of the strings at `texts` (`text`), such as
    /// a request's `model`; together at most `MAX_PATHS`.
    pub fn with_texts(
        format: BodyFormat,
        paths: Vec<Vec<String>>,
        texts: Vec<Vec<String>>,
    ) -> UsageReader {
        UsageReader::reading(format, paths, texts, false)
    }

    /// A reader of a request's JSON body, which an upstream parses after this filter: as
    /// `with_texts`, and a key that Go's case-insensitive reader alone takes for a path's
    /// (`{"Model": ...}`, or a second `MODEL`) makes it `repeated`.
    pub fn of_request(paths: Vec<Vec<String>>, texts: Vec<Vec<String>>) -> UsageReader {
        UsageReader::reading(BodyFormat::Json, paths, texts, true)
    }

    fn reading(
        format: BodyFormat,
        mut paths: Vec<Vec<String>>,
        texts: Vec<Vec<String>>,
        fold: bool,
    ) -> UsageReader {
        let first_text = paths.len();
        paths.extend(texts);
        let paths = paths::Paths::new(paths, first_text, fold);
        UsageReader {
            json: json::Scanner::new(paths, first_text),
            framing: match format {
                BodyFormat::Json => Framing::Json,
                BodyFormat::EventStream => Framing::Events(events::Framer::new()),
                BodyFormat::AwsEventStream => Framing::Frames(eventstream::Frames::new()),
            },
            text: utf8::Utf8::default(),
            bytes: 0,
            head: [0xff; 3],
            finished: false,
        }
    }

    /// One chunk of the body, as it passes. After `finish`, chunks are counted in `bytes`
    /// but not read.
    pub fn feed(&mut self, chunk: &[u8]) {
        let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
        let at = usize::try_from(self.bytes).unwrap_or(usize::MAX);
        if let Some(head) = self.head.get_mut(at..) {
            let n = head.len().min(chunk.len());
            if let (Some(to), Some(from)) = (head.get_mut(..n), chunk.get(..n)) {
                to.copy_from_slice(from);
            }
        }
        self.bytes = self.bytes.saturating_add(len);
        if self.finished {
            return;
        }
        match &mut self.framing {
            Framing::Json => {
                self.text.feed(chunk);
                self.json.feed(chunk);
            }
            Framing::Events(framer) => {
                self.text.feed(chunk);
                framer.feed(chunk, &mut self.json);
            }
            // Binary: only its payloads are text.
            Framing::Frames(frames) => frames.feed(chunk, &mut self.json, &mut self.text),
        }
    }

    /// The body has ended: a number still pending at its very end is complete (a body
    /// without its closing bracket, as a path always ends inside an object), and an event
    /// it ended inside, never dispatched, is distrusted if it held a value at a path.
    /// Idempotent.
    pub fn finish(&mut self) {
        if !self.finished {
            self.json.finish();
            if matches!(&self.framing, Framing::Events(framer) if framer.pending()) {
                self.json.undispatched();
            }
            self.finished = true;
        }
    }

    /// Whether the stream said it is done (OpenAI's `data: [DONE]`, read whole): it reports
    /// nothing after, so a cut that follows loses nothing.
    pub fn done(&self) -> bool {
        matches!(&self.framing, Framing::Events(framer) if framer.done())
    }

    /// The last usable count seen at each path, in the order of `paths`; `None` where
    /// there was none.
    pub fn values(&self) -> &[Option<u64>] {
        self.json.found().values()
    }

    /// The largest usable count seen at each path, in the order of `paths`.
    pub fn largest(&self) -> &[Option<u64>] {
        self.json.found().largest()
    }

    /// What the `index`th text path held last (`Text::Absent` for a path that is none).
    pub fn text(&self, index: usize) -> Text<'_> {
        self.json.found().text(index)
    }

    /// True once a path held something other than a usable count or `null`.
    pub fn poisoned(&self) -> bool {
        self.json.found().poisoned()
    }

    /// Whether `values` can be trusted to be all the body said, as far as it was read: a
    /// JSON body read to its well-formed end (one cut short or malformed may have lost
    /// fields that followed); an event stream whose every event that opened an object
    /// closed it; an AWS event stream, the same, framed well and ended between messages;
    /// in each, no path poisoned, no key on a path repeated in one object, no
    /// count that went down (usage counts only grow over a stream: a smaller one came
    /// from an event a strict reader would not read), and UTF-8 throughout (readers differ
    /// on a broken character: a strict one refuses its event, a browser's replaces it).
    /// (Whether the body itself ended is the caller's to know.)
    pub fn trusted(&self) -> bool {
        let found = self.json.found();
        self.well_formed()
            && !found.poisoned()
            && !found.repeated()
            && found.values() == found.largest()
    }

    /// Whether the body was read whole as far as `trusted` asks, leaving aside what was at
    /// its paths: framed well, no object cut short, UTF-8 throughout.
    pub fn well_formed(&self) -> bool {
        let found = self.json.found();
        let whole = match &self.framing {
            Framing::Json => self.json.closed(),
            Framing::Events(_) => !found.broken(),
            Framing::Frames(frames) => !found.broken() && frames.whole(),
        };
        whole && self.text.whole()
    }

    /// True once a key on a path came twice in one object.
    pub fn repeated(&self) -> bool {
        self.json.found().repeated()
    }

    /// Whether the (last) value read began as an object, its first byte past any
    /// whitespace a `{`.
    pub fn began_object(&self) -> bool {
        self.json.began_object()
    }

    /// Whether the body, read as UTF-8, is not what Python's JSON reader reads: it begins
    /// with a byte order mark or a NUL (`utf8::foreign`).
    pub fn foreign_encoding(&self) -> bool {
        let fed = usize::try_from(self.bytes).unwrap_or(usize::MAX);
        utf8::foreign(
            self.head
                .get(..fed.min(self.head.len()))
                .unwrap_or_default(),
        )
    }

    /// The bytes fed so far, saturating.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "props_tests.rs"]
mod props;

#[cfg(test)]
#[path = "texts_tests.rs"]
mod texts_tests;
