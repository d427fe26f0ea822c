//! A field of a JSON body, as the configuration names one: a dotted path from the root
//! (`usage.prompt_tokens`, `model`), for a meter's counts, a reservation's ask and a body
//! identity alike, bounded as the gateway's one-pass reader follows paths.

use crate::error::{err, ConfigError};

/// Most segments of a field's path (`usage.prompt_tokens` has 2).
pub const MAX_SEGMENTS: usize = 8;
/// Longest segment of a field's path, in bytes.
pub const MAX_SEGMENT_LEN: usize = 64;

/// `path` (at `at`) as the names of its segments: a dotted path of 1 to `MAX_SEGMENTS`
/// names of 1 to `MAX_SEGMENT_LEN` printable ASCII characters (no space). ASCII, because
/// the gateway must find a field under every key an upstream takes for it, and Go's JSON
/// reader folds letter case; the four characters beyond ASCII that fold into ASCII are
/// known, the rest of Unicode's case folding would be a table in the filter.
pub fn field_path(at: &str, path: &str) -> Result<Vec<String>, ConfigError> {
    let segments: Vec<String> = path.split('.').map(str::to_string).collect();
    let bad_segment = segments.iter().any(|s| {
        s.is_empty() || s.len() > MAX_SEGMENT_LEN || !s.bytes().all(|b| b.is_ascii_graphic())
    });
    if segments.len() > MAX_SEGMENTS || bad_segment {
        return err(
            at,
            format!(
                "a field is a dotted path of 1 to {MAX_SEGMENTS} names of 1 to \
                 {MAX_SEGMENT_LEN} printable ASCII characters, like usage.prompt_tokens"
            ),
        );
    }
    Ok(segments)
}
