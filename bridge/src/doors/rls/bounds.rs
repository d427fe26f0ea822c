//! The bounds a configuration's YAML is held to before the YAML parser reads it: its size,
//! and how deep its collections nest. The parser (libyaml, under serde_yaml_ng) reads a
//! whole document before anything refuses it, and its time grows with the square of the
//! depth of nested flow collections (`[[[[...`: each token looks at every open level): a
//! 160 kB file stalled the bridge 21 s before its depth was refused.
//!
//! The depth is found by a scan that cannot be fooled by text the parser reads otherwise:
//! where a byte could end or begin a quoted string, a comment, a plain or block scalar
//! depending on rules of YAML the scan does not model (indentation, which `'` opens a
//! string), it follows every reading at once, and reports the deepest any reaches. Every
//! reading the parser could take is among them, so the parser never nests deeper than
//! reported; a legitimate file is read one way, or the readings agree.

/// Largest configuration file, and YAML text, read: envoyproxy/ratelimit's largest
/// known configurations are tens of kilobytes.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
/// Deepest nesting of flow collections (`[`, `{`), and of block indentation levels: a
/// domain's descriptors nest at most 16 deep (`limits`), 2 levels each.
pub const MAX_NESTING: usize = 64;

/// Where a reading of the text stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Between tokens.
    Token,
    /// In a plain scalar, after one of its characters.
    Plain,
    /// In a plain scalar, after a space or line break (where `#` starts a comment).
    PlainGap,
    Single,
    /// In a single-quoted string, on the second `'` of `''`.
    SingleQuote,
    Double,
    /// In a double-quoted string, after `\`.
    DoubleEscape,
    Comment,
    /// An anchor, alias or tag.
    Property,
    /// A block scalar's header line (`|`, `>`).
    BlockHeader,
    /// A block scalar's content.
    BlockBody,
}

const MODES: [Mode; 11] = [
    Mode::Token,
    Mode::Plain,
    Mode::PlainGap,
    Mode::Single,
    Mode::SingleQuote,
    Mode::Double,
    Mode::DoubleEscape,
    Mode::Comment,
    Mode::Property,
    Mode::BlockHeader,
    Mode::BlockBody,
];

/// Every reading's mode with its flow depth (the deepest of the readings in that mode:
/// from one mode on, a deeper reading stays at least as deep).
#[derive(Debug, Clone, Copy, Default)]
struct Readings([Option<usize>; MODES.len()]);

impl Readings {
    fn add(&mut self, mode: Mode, depth: usize) {
        let slot = &mut self.0[mode as usize];
        *slot = Some(slot.map_or(depth, |d| d.max(depth)));
    }

    fn iter(&self) -> impl Iterator<Item = (Mode, usize)> + '_ {
        MODES
            .iter()
            .zip(self.0.iter())
            .filter_map(|(&mode, depth)| depth.map(|d| (mode, d)))
    }
}

/// Why `text` may not be given to the YAML parser, if it may not.
pub fn check(text: &str) -> Result<(), String> {
    if text.len() > MAX_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_BYTES} a configuration may hold",
            text.len()
        ));
    }
    let s = text.as_bytes();
    let mut now = Readings::default();
    now.add(Mode::Token, 0);
    let (mut i, mut line) = (0, 1);
    let mut indents: Vec<usize> = Vec::new();
    let mut line_start = true;
    while i < s.len() {
        if line_start {
            let levels = block_levels(&mut indents, s.get(i..).unwrap_or_default(), &now);
            if levels > MAX_NESTING {
                return Err(too_deep(line, "block collections are indented"));
            }
            line_start = false;
        }
        let (step, brk) = match line_break(s, i) {
            Some(len) => (len, true),
            None => (1, false),
        };
        let c = if brk { b'\n' } else { s[i] };
        let next = s.get(i + step).copied();
        let mut then = Readings::default();
        for (mode, depth) in now.iter() {
            advance(&mut then, mode, depth, c, next);
        }
        if then.iter().any(|(_, depth)| depth > MAX_NESTING) {
            return Err(too_deep(line, "flow collections ('[', '{') nest"));
        }
        now = then;
        i += step;
        if brk {
            line += 1;
            line_start = true;
        }
    }
    Ok(())
}

fn too_deep(line: usize, what: &str) -> String {
    format!(
        "line {line}: {what} deeper than {MAX_NESTING} levels, which no configuration needs \
         (refused before the YAML is parsed)"
    )
}

/// The length of the line break at `i` (`\n`, `\r`, `\r\n`, and the breaks libyaml also
/// takes: NEL, LS, PS), if one is there.
fn line_break(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i..).unwrap_or_default() {
        [b'\r', b'\n', ..] | [0xC2, 0x85, ..] => Some(2),
        [b'\n' | b'\r', ..] => Some(1),
        [0xE2, 0x80, 0xA8 | 0xA9, ..] => Some(3),
        _ => None,
    }
}

fn is_blank_or_end(b: Option<u8>) -> bool {
    matches!(b, None | Some(b' ' | b'\t' | b'\n' | b'\r'))
}

/// Adds to `then` the readings that `mode` at flow depth `depth` becomes past byte `c`
/// (`\n` for any line break), `next` following it.
fn advance(then: &mut Readings, mode: Mode, depth: usize, c: u8, next: Option<u8>) {
    use Mode::*;
    let flow = depth > 0;
    match mode {
        Token => match c {
            b' ' | b'\t' | b'\n' | b',' => then.add(Token, depth),
            b'#' | b'%' => then.add(Comment, depth),
            b'[' | b'{' => then.add(Token, depth + 1),
            b']' | b'}' => then.add(Token, depth.saturating_sub(1)),
            b'\'' => then.add(Single, depth),
            b'"' => then.add(Double, depth),
            b'&' | b'*' | b'!' => then.add(Property, depth),
            b'|' | b'>' if !flow => then.add(BlockHeader, depth),
            // An indicator when a blank follows (and `?`, `:` in a flow), else the first
            // character of a plain scalar: both, where it depends on the version.
            b'-' | b'?' | b':' => {
                then.add(Token, depth);
                if !is_blank_or_end(next) {
                    then.add(Plain, depth);
                }
            }
            // A byte order mark is skipped; anything else starts a plain scalar.
            0x80.. => {
                then.add(Token, depth);
                then.add(Plain, depth);
            }
            _ => then.add(Plain, depth),
        },
        Plain | PlainGap => match c {
            b' ' | b'\t' => then.add(PlainGap, depth),
            // The scalar goes on to the next line, or ends there: it depends on indentation.
            b'\n' => {
                then.add(PlainGap, depth);
                then.add(Token, depth);
            }
            b'#' if mode == PlainGap => then.add(Comment, depth),
            b':' | b'?' => {
                then.add(Plain, depth);
                advance(then, Token, depth, c, next);
            }
            b',' | b'[' | b']' | b'{' | b'}' if flow => advance(then, Token, depth, c, next),
            _ => then.add(Plain, depth),
        },
        Single => match c {
            b'\'' if next == Some(b'\'') => then.add(SingleQuote, depth),
            b'\'' => then.add(Token, depth),
            _ => then.add(Single, depth),
        },
        SingleQuote => then.add(Single, depth),
        Double => match c {
            b'\\' => then.add(DoubleEscape, depth),
            b'"' => then.add(Token, depth),
            _ => then.add(Double, depth),
        },
        DoubleEscape => then.add(Double, depth),
        Comment => match c {
            b'\n' => then.add(Token, depth),
            _ => then.add(Comment, depth),
        },
        Property => match c {
            b' ' | b'\t' | b'\n' => then.add(Token, depth),
            b',' | b'[' | b']' | b'{' | b'}' => {
                then.add(Property, depth);
                advance(then, Token, depth, c, next);
            }
            _ => then.add(Property, depth),
        },
        BlockHeader => match c {
            b'\n' => {
                then.add(BlockBody, depth);
                then.add(Token, depth);
            }
            _ => then.add(BlockHeader, depth),
        },
        // Its content ends where a line is indented less: either reading, at each line.
        BlockBody => match c {
            b'\n' => {
                then.add(BlockBody, depth);
                then.add(Token, depth);
            }
            _ => then.add(BlockBody, depth),
        },
    }
}

/// The block indentation levels open at the start of `line` (`indents`, updated), and the
/// compact ones it opens (`- - x`): lines of which no reading may start a block token are
/// not counted (inside strings, flow collections, block scalars).
fn block_levels(indents: &mut Vec<usize>, line: &[u8], now: &Readings) -> usize {
    let in_block = now
        .iter()
        .any(|(mode, depth)| depth == 0 && matches!(mode, Mode::Token | Mode::PlainGap));
    let indent = line.iter().take_while(|&&b| b == b' ').count();
    let rest = line.get(indent..).unwrap_or_default();
    let empty = matches!(rest.first(), None | Some(b'#' | b'\n' | b'\r'));
    if !in_block || empty {
        return indents.len();
    }
    while indents.last().is_some_and(|&top| top > indent) {
        indents.pop();
    }
    if indents.last().is_none_or(|&top| top < indent) {
        indents.push(indent);
    }
    let compact = rest
        .chunks(2)
        .take_while(|pair| matches!(pair, [b'-' | b'?', b' ']))
        .count();
    indents.len() + compact
}

#[cfg(test)]
#[path = "bounds_tests.rs"]
mod tests;
