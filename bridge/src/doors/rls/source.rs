//! Where the configuration comes from: `--rls-config`, one YAML file or a directory of them
//! (`*.yaml`, `*.yml`, one domain each, as envoyproxy/ratelimit's runtime directory holds
//! them; not hidden ones, as a Kubernetes ConfigMap's mount holds its own), read again
//! when any of them changes, within bounds (`bounds`). A configuration that does not load is
//! logged and the one in force stays; buckets live in Redis under keys the configuration
//! does not change, so a reload loses none of them.

use super::bounds::MAX_BYTES;
use super::limits::Limits;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The files `path` names: itself, or the YAML files in it, by name.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let hidden = p
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with('.'));
            !hidden
                && p.is_file()
                && p.extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Most bytes read from all of a directory's files.
const MAX_TOTAL_BYTES: usize = 4 * MAX_BYTES;

/// Reads the configuration at `path` (blocking: the bridge calls it off its runtime). No
/// file is read past `bounds::MAX_BYTES`, nor a directory past `MAX_TOTAL_BYTES`; files of
/// one domain are merged with `merge`, else refused.
pub fn load(path: &Path, merge: bool) -> Result<Limits, String> {
    let mut total = 0;
    let texts = files(path)?
        .into_iter()
        .map(|file| {
            let name = file.display().to_string();
            let mut bytes = Vec::new();
            std::fs::File::open(&file)
                .and_then(|f| f.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
                .map_err(|e| format!("{name}: {e}"))?;
            total += bytes.len();
            if bytes.len() > MAX_BYTES || total > MAX_TOTAL_BYTES {
                return Err(format!(
                    "{name}: past the {MAX_BYTES} bytes a configuration file may hold, or \
                     the {MAX_TOTAL_BYTES} of all of them"
                ));
            }
            let text = String::from_utf8(bytes).map_err(|e| format!("{name}: {e}"))?;
            Ok((name, text))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Limits::parse(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())), merge)
}

/// What tells a change: each file's name, size and modification time.
pub type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// The stamp of `path` as it is now (empty if it cannot be read).
pub fn stamp(path: &Path) -> Stamp {
    files(path)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            (file, len, modified)
        })
        .collect()
}
