//! Where in a JSON text a parse error lies, as the path of the field at fault
//! (`rules[2].limit.per`), which a refused configuration names.
//!
//! serde_json tells the line and column of an error; reading the text up to there gives
//! the path. A path-tracking deserializer (`serde_path_to_error`) did the same by wrapping
//! every configuration type's deserializer in a second copy: 95 KB, a fifth of the
//! `.wasm`'s code (`docs/architecture.md`, "What the `.wasm` is made of").
//!
//! The path is that of the innermost value the error is in: a key once read (an unknown
//! field is named with its key), and an element once begun, up to the end of its value. An
//! error about a whole object or list (a missing field, met at its closing brace; a list
//! where an object belongs, met at its opening) names that object or list. Any text
//! (invalid, truncated, hostile) gives a path or `None`, never a panic.

/// One open object or array, and where the scan is in it: its current key (object) or
/// index (array), whether that member has begun, and whether its value has ended.
struct Open {
    key: Option<String>,
    index: Option<usize>,
    begun: bool,
    ended: bool,
}

impl Open {
    fn object() -> Open {
        Open {
            key: None,
            index: None,
            begun: false,
            ended: false,
        }
    }

    fn array() -> Open {
        Open {
            index: Some(0),
            ..Open::object()
        }
    }
}

/// The path (`a.b[2].c`) at line `line`, column `column` (1-based, serde_json's: the
/// column of the last byte read) of `json`; `None` at the top level.
pub fn at(json: &[u8], line: usize, column: usize) -> Option<String> {
    let start = line_start(json, line)?;
    // The last byte read is not scanned: an error at a closing brace is about that object.
    let end = start
        .saturating_add(column.saturating_sub(1))
        .min(json.len());
    let mut path = String::new();
    for open in scan(json.get(..end)?, json.get(end).copied()) {
        if !open.begun || open.ended {
            break;
        }
        match (open.key, open.index) {
            (Some(key), _) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&key);
            }
            (None, Some(i)) => path.push_str(&format!("[{i}]")),
            (None, None) => break,
        }
    }
    (!path.is_empty()).then_some(path)
}

/// The offset where line `line` (1-based) begins.
fn line_start(json: &[u8], line: usize) -> Option<usize> {
    if line <= 1 {
        return Some(0);
    }
    let newline = json
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(line - 2)?;
    Some(newline.0 + 1)
}

/// Bytes that end a number or a literal.
const AFTER_SCALAR: &[u8] = b",}] \t\r\n";

/// What is open at the end of `text`, outermost first; `next`: the byte after it (a number
/// that runs to the end of `text` has ended if `next` ends it).
fn scan(text: &[u8], next: Option<u8>) -> Vec<Open> {
    let mut stack: Vec<Open> = Vec::new();
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        if b.is_ascii_whitespace() || b == b':' {
            i += 1;
            continue;
        }
        if matches!(b, b'}' | b']') {
            stack.pop();
            end_value(&mut stack);
            i += 1;
            continue;
        }
        if b == b',' {
            if let Some(open) = stack.last_mut() {
                open.key = None;
                open.index = open.index.map(|n| n + 1);
                (open.begun, open.ended) = (false, false);
            }
            i += 1;
            continue;
        }
        // A key, or the start of a value.
        let is_key = stack
            .last()
            .is_some_and(|open| open.index.is_none() && open.key.is_none());
        if let Some(open) = stack.last_mut() {
            open.begun = true;
        }
        match b {
            b'{' => stack.push(Open::object()),
            b'[' => stack.push(Open::array()),
            b'"' => {
                let (string, next) = read_string(text, i + 1);
                let Some(next) = next else {
                    // The text ends in this string: a key (all but its closing quote,
                    // where serde_json reports an unknown field), or the value at fault.
                    if let Some(open) = stack.last_mut().filter(|_| is_key) {
                        open.key = Some(string);
                    }
                    break;
                };
                match stack.last_mut() {
                    Some(open) if is_key => open.key = Some(string),
                    _ => end_value(&mut stack),
                }
                i = next;
                continue;
            }
            _ => {
                // A number or a literal, up to what ends it.
                let rest = text.get(i..).unwrap_or_default();
                let Some(len) = rest.iter().position(|c| AFTER_SCALAR.contains(c)) else {
                    if next.is_some_and(|c| AFTER_SCALAR.contains(&c)) {
                        end_value(&mut stack);
                    }
                    break;
                };
                end_value(&mut stack);
                i += len;
                continue;
            }
        }
        i += 1;
    }
    stack
}

/// The value of the innermost open member ended: its key no longer names where the scan
/// is.
fn end_value(stack: &mut [Open]) {
    if let Some(open) = stack.last_mut() {
        open.ended = true;
    }
}

/// The string whose body starts at `from` (after its opening quote), unescaped as far as a
/// path shows it, and the offset after its closing quote (`None`: it does not close).
fn read_string(text: &[u8], from: usize) -> (String, Option<usize>) {
    let mut out = Vec::new();
    let mut i = from;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => return (String::from_utf8_lossy(&out).into_owned(), Some(i + 1)),
            b'\\' => {
                match text.get(i + 1) {
                    Some(b'n') => out.push(b'\n'),
                    Some(b't') => out.push(b'\t'),
                    Some(b'r') => out.push(b'\r'),
                    Some(b'b') => out.push(8),
                    Some(b'f') => out.push(12),
                    Some(b'u') => {
                        let hex = text
                            .get(i + 2..i + 6)
                            .and_then(|h| std::str::from_utf8(h).ok());
                        let c = hex.and_then(|h| u32::from_str_radix(h, 16).ok());
                        let c = c.and_then(char::from_u32).unwrap_or('\u{fffd}');
                        out.extend(c.to_string().as_bytes());
                        i += 4;
                    }
                    Some(&other) => out.push(other),
                    None => break,
                }
                i += 2;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path where serde_json would report an error whose last byte read is the last
    /// byte of the first `at` in `json`.
    fn path(json: &str, at_text: &str) -> Option<String> {
        let offset = json.find(at_text).unwrap() + at_text.len() - 1;
        let line = json[..offset].matches('\n').count() + 1;
        let column = offset - json[..offset].rfind('\n').map_or(0, |n| n + 1) + 1;
        at(json.as_bytes(), line, column)
    }

    #[test]
    fn a_value_is_named_by_its_keys_and_indices() {
        let json = r#"{"rules": [{"a": 1}, {"limit": {"per": 5}}]}"#;
        assert_eq!(path(json, "5"), Some("rules[1].limit.per".into()));
        assert_eq!(
            path(json, "[{"),
            Some("rules".into()),
            "a list where it opens"
        );
        assert_eq!(
            path(json, "1}"),
            Some("rules[0]".into()),
            "an object where it closes"
        );
    }

    #[test]
    fn a_key_names_itself_and_a_closing_brace_its_object() {
        let json = r#"{"backend": {"redis": {"cluster": "r", "database": 1}}}"#;
        // An unknown key, where serde_json stops: its closing quote.
        assert_eq!(
            path(json, r#""database""#),
            Some("backend.redis.database".into())
        );
        assert_eq!(path(json, "1}"), Some("backend.redis".into()));
        assert_eq!(path(json, "{"), None);
        assert_eq!(at(b"[]", 1, 2), None, "the top level is no field");
    }

    #[test]
    fn lines_strings_and_escapes_are_read_as_json_reads_them() {
        let json = "{\n  \"a\\\"b\": {\"x,]}\": [0,\n 1, \"s\"]}}";
        assert_eq!(path(json, "\"s"), Some("a\"b.x,]}[2]".into()));
    }

    #[test]
    fn any_text_gives_a_path_or_none_without_panicking() {
        for text in [
            "",
            "{",
            "\"",
            "{\"a",
            "{\"a\\",
            "{\"a\\u12",
            "[[[[",
            "}}]]",
            "{\"a\":[,,",
        ] {
            for column in 0..text.len() + 3 {
                for line in 0..3 {
                    let _ = at(text.as_bytes(), line, column);
                }
            }
        }
    }
}
