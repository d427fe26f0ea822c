//! Who may check, and so consume, buckets, and who may change limits. Whoever reaches the
//! bridge can spend any bucket's tokens (deny a user everything, or reset nothing but take
//! it all), so with a shared secret (`--token-file`) a check is served only to callers that
//! present it, as `authorization: Bearer <token>` on a callout and in the initial metadata
//! of the gRPC stream. `/healthz` stays open: probes carry no token, and it only tells
//! whether Redis answers. The admin endpoints want another secret (`--admin-token-file`):
//! every gateway holds the gateways' token, and Envoy shows it to whoever reaches its admin
//! port (`/config_dump`), so it must not also change every client's limits.

use hyper::header::{HeaderMap, AUTHORIZATION};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Anyone (no token file) or only holders of the token.
#[derive(Clone)]
pub struct Access(Option<Arc<[u8]>>);

impl Access {
    /// No token: every caller is served.
    pub const fn open() -> Access {
        Access(None)
    }

    /// Holders of the gateways' token in `path` (`--token-file`).
    pub fn from_token_file(path: &Path) -> Result<Access, String> {
        Access::from_file("--token-file", path)
    }

    /// Holders of the operators' token in `path` (`--admin-token-file`), which must not be
    /// the gateways' (`gateways`): that one opens no admin endpoint.
    pub fn from_admin_token_file(path: &Path, gateways: &Access) -> Result<Access, String> {
        let admin = Access::from_file("--admin-token-file", path)?;
        if admin.0 == gateways.0 {
            return Err(format!(
                "--admin-token-file {}: the same token as --token-file; the operators' \
                 secret must be another (every gateway holds the gateways' token)",
                path.display()
            ));
        }
        Ok(admin)
    }

    /// Holders of the token in `path` (its content, surrounding whitespace trimmed), read
    /// for `flag`, which errors name.
    fn from_file(flag: &str, path: &Path) -> Result<Access, String> {
        let context = |why: String| format!("{flag} {}: {why}", path.display());
        let content = std::fs::read(path).map_err(|e| context(format!("cannot read it: {e}")))?;
        let token = content.trim_ascii();
        if token.is_empty() {
            return Err(context("the file is empty".into()));
        }
        // What a header value can carry as one token, so that gateways can send it.
        if !token.iter().all(u8::is_ascii_graphic) {
            return Err(context(
                "the token must be printable ASCII without spaces".into(),
            ));
        }
        Ok(Access(Some(token.into())))
    }

    pub fn is_open(&self) -> bool {
        self.0.is_none()
    }

    /// Whether a request with `headers` may check: with a token, exactly one
    /// `authorization` header, scheme `Bearer` (any case, as schemes are), one space, and
    /// the token, compared in constant time so that timing tells nothing about it.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.0 else {
            return true;
        };
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return false;
        };
        let Some((scheme, presented)) = value.to_str().ok().and_then(|v| v.split_once(' ')) else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && bool::from(presented.as_bytes().ct_eq(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;
    use std::path::PathBuf;

    fn token_file(name: &str, content: &[u8]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("ratelimit-access-{}-{name}", std::process::id()));
        std::fs::write(&path, content).unwrap();
        path
    }

    fn headers(values: &[&'static str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(AUTHORIZATION, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn the_token_is_the_file_trimmed() {
        let path = token_file("trimmed", b"  s3cret-Token\n");
        let access = Access::from_token_file(&path).unwrap();
        std::fs::remove_file(path).unwrap();
        assert!(!access.is_open());
        assert!(access.admits(&headers(&["Bearer s3cret-Token"])));
        assert!(access.admits(&headers(&["bearer s3cret-Token"])));
        for refused in [
            &[][..],
            &["Bearer s3cret-token"],
            &["Bearer s3cret-Toke"],
            &["Bearer s3cret-Token2"],
            &["Bearer  s3cret-Token"],
            &["Basic s3cret-Token"],
            &["s3cret-Token"],
            &["Bearer s3cret-Token", "Bearer s3cret-Token"],
        ] {
            assert!(!access.admits(&headers(refused)), "{refused:?}");
        }
    }

    #[test]
    fn empty_unreadable_or_unsendable_token_files_are_refused() {
        let empty = token_file("empty", b" \n\t\n");
        let err = Access::from_token_file(&empty).err().unwrap();
        std::fs::remove_file(&empty).unwrap();
        assert!(
            err.contains("empty") && err.contains("--token-file"),
            "{err}"
        );
        let spaced = token_file("spaced", b"two words\n");
        let err = Access::from_token_file(&spaced).err().unwrap();
        std::fs::remove_file(&spaced).unwrap();
        assert!(err.contains("printable"), "{err}");
        let missing = std::env::temp_dir().join("ratelimit-access-no-such-file");
        let err = Access::from_token_file(&missing).err().unwrap();
        assert!(
            err.contains("cannot read") && err.contains("no-such-file"),
            "{err}"
        );
    }

    #[test]
    fn the_admin_token_must_differ_from_the_gateways() {
        let gateways = token_file("gateways", b"one-token\n");
        let same = token_file("same", b" one-token");
        let other = token_file("other", b"another-token");
        let gateway_access = Access::from_token_file(&gateways).unwrap();
        let err = Access::from_admin_token_file(&same, &gateway_access)
            .err()
            .unwrap();
        assert!(
            err.contains("--admin-token-file") && err.contains("same token"),
            "{err}"
        );
        let admin = Access::from_admin_token_file(&other, &gateway_access).unwrap();
        assert!(admin.admits(&headers(&["Bearer another-token"])));
        assert!(!admin.admits(&headers(&["Bearer one-token"])));
        let empty = token_file("admin-empty", b"\n");
        let err = Access::from_admin_token_file(&empty, &Access::open())
            .err()
            .unwrap();
        assert!(
            err.starts_with("--admin-token-file") && err.contains("empty"),
            "{err}"
        );
        for path in [gateways, same, other, empty] {
            std::fs::remove_file(path).unwrap();
        }
    }

    #[test]
    fn without_a_token_everyone_is_admitted() {
        assert!(Access::open().is_open());
        assert!(Access::open().admits(&HeaderMap::new()));
    }
}
