//! A configured value with `*` in it, matched as envoyproxy/ratelimit matches one: each `*`
//! stands for any run of characters, none included, anywhere in the value (`/api*v1`,
//! `foo*bar*baz`), not only at its end. The pattern is split once, at load, so a call's
//! lookup allocates nothing.

/// A value's pattern: the literal parts between its `*`s (at least two).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    /// The configured value, `*`s and all: what a `share_threshold` bucket is keyed on.
    pub pattern: String,
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern of `value`, if it holds a `*`.
    pub fn new(value: &str) -> Option<Wildcard> {
        value.contains('*').then(|| Wildcard {
            pattern: value.to_owned(),
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `value` matches: it starts with the first part, ends with the last, and
    /// holds the others in order between them, none overlapping.
    pub fn matches(&self, value: &str) -> bool {
        let [first, middle @ .., last] = self.parts.as_slice() else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if value.len() < fixed {
            return false;
        }
        let Some(rest) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
            return false;
        };
        for part in middle {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// envoyproxy/ratelimit's own cases (test/config/config_test.go's wildcard tests).
    #[test]
    fn a_star_anywhere_is_any_run_of_characters() {
        let cases = [
            ("foo*", "foobar", true),
            ("foo*", "foo", true),
            ("foo*", "fo", false),
            ("bar*b", "barab", true),
            ("bar*b", "barb", true),
            ("bar*b", "bar", false),
            ("bar*b", "barba", false),
            ("foo*bar*baz", "fooXbarYbaz", true),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foobazbar", false),
            ("/api*v1", "/api/users/v1", true),
            ("/api*v1", "/api/users/v2", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("*x*", "yxy", true),
            ("*x*", "yy", false),
        ];
        for (pattern, value, expected) in cases {
            let wildcard = Wildcard::new(pattern).unwrap();
            assert_eq!(wildcard.matches(value), expected, "{pattern} ~ {value}");
        }
        assert_eq!(Wildcard::new("plain"), None);
    }
}
