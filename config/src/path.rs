//! The one form of a request path that rules match on.
//!
//! Clients can write one path many ways (`/api//search`, `/api/%73earch`, `/api/./search`,
//! `/api/x/../search`) and upstreams serve them all as `/api/search`, so matching the raw
//! `:path` let every spelling but the configured one dodge a rule. Hosts normalize only when
//! told to (Envoy's `normalize_path` and `merge_slashes` are off by default; other hosts
//! differ), so the filter normalizes itself, whatever the host did before it.

/// `raw` (a `:path` value) in normal form: query and fragment dropped; escapes of unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) decoded, the other escapes kept with upper-case hex
/// (`%2f` becomes `%2F`: an escaped slash is not a separator) and malformed ones (`%zz`)
/// kept as written; then empty and `.` segments removed and each `..` removing the segment
/// before it, never climbing above the root (RFC 3986 section 5.2.4 after merging slashes).
///
/// Idempotent, so a path the host already normalized and a pattern checked at load are
/// both fixed points; linear in `raw.len()`; any bytes are accepted, UTF-8 or not.
pub fn normalize(raw: &[u8]) -> Vec<u8> {
    let path = raw
        .split(|&b| b == b'?' || b == b'#')
        .next()
        .unwrap_or_default();
    remove_dot_segments(&decode_unreserved(path))
}

// Decoding first makes `%2e` a dot that dot-segment removal sees, as an upstream that
// decodes before resolving would.
fn decode_unreserved(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut rest = path;
    while let [byte, tail @ ..] = rest {
        if let (b'%', [high, low, after @ ..]) = (*byte, tail) {
            if let (Some(h), Some(l)) = (hex_value(*high), hex_value(*low)) {
                let decoded = h << 4 | l;
                if is_unreserved(decoded) && !forms_escape(&out, decoded) {
                    out.push(decoded);
                } else {
                    out.extend_from_slice(&[
                        b'%',
                        high.to_ascii_uppercase(),
                        low.to_ascii_uppercase(),
                    ]);
                }
                rest = after;
                continue;
            }
        }
        out.push(*byte);
        rest = tail;
    }
    out
}

// After a stray `%` (or `%` and one hex digit), a decoded hex digit would write an escape
// that was not in the input (`%%34%31` to `%41`), which a second pass would decode: it stays
// encoded, so that normalizing is idempotent.
fn forms_escape(out: &[u8], decoded: u8) -> bool {
    decoded.is_ascii_hexdigit()
        && match out {
            [.., b'%'] => true,
            [.., b'%', digit] => digit.is_ascii_hexdigit(),
            _ => false,
        }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

// One pass over the segments, which merges slashes (empty segments are dropped) and removes
// dot segments at once. Every segment but the last is written with its trailing `/`, so a
// path ending in `/`, `/.` or `/..` keeps its trailing slash, as in RFC 3986.
fn remove_dot_segments(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1);
    if path.first() == Some(&b'/') {
        out.push(b'/');
    }
    let mut segments = path.split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        match segment {
            b"" | b"." => {}
            b".." => pop_segment(&mut out),
            _ => {
                out.extend_from_slice(segment);
                if segments.peek().is_some() {
                    out.push(b'/');
                }
            }
        }
    }
    out
}

// `out` is empty, the root, or segments each followed by `/`. Each byte is scanned once
// here and then dropped, which keeps the whole pass linear.
fn pop_segment(out: &mut Vec<u8>) {
    let Some((_, above)) = out.split_last() else {
        return;
    };
    if above.is_empty() {
        return;
    }
    match above.iter().rposition(|&b| b == b'/') {
        Some(slash) => out.truncate(slash + 1),
        // The first segment of a relative path: RFC 3986 leaves `/` (`a/../b` is `/b`).
        None => {
            out.clear();
            out.push(b'/');
        }
    }
}

#[cfg(test)]
#[path = "path_tests.rs"]
mod tests;
