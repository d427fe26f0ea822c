//! Request templates: header values and bodies that vary with the request's sequence
//! number, so that one run can spread its load over many rate-limit keys.
//!
//! `{n}` is the run-wide request number (0, 1, 2, ...) and `{n%K}` (spaces allowed) is that
//! number modulo `K`, e.g. `x-user-id: u{n % 10000}` cycles through 10,000 users. `{{` and
//! `}}` are literal braces.

use std::fmt::Write;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// The request number, reduced modulo the value when there is one.
    Number(Option<u64>),
}

/// A parsed template; rendering never fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; an unknown placeholder or an unclosed brace is an error.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(i) = rest.find(['{', '}']) {
            literal.push_str(&rest[..i]);
            let tail = &rest[i..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                literal.push_str(&tail[..1]);
                rest = &tail[2..];
                continue;
            }
            if tail.starts_with('}') {
                return Err(format!("unmatched '}}' in template {text:?}"));
            }
            let end = tail
                .find('}')
                .ok_or_else(|| format!("unclosed '{{' in template {text:?}"))?;
            if !literal.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut literal)));
            }
            parts.push(placeholder(&tail[1..end])?);
            rest = &tail[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The text for request number `n`.
    pub fn render(&self, n: u64) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Number(None) => {
                    let _ = write!(out, "{n}");
                }
                Part::Number(Some(k)) => {
                    let _ = write!(out, "{}", n % k);
                }
            }
        }
        out
    }
}

fn placeholder(inner: &str) -> Result<Part, String> {
    let compact: String = inner.chars().filter(|c| !c.is_whitespace()).collect();
    if compact == "n" {
        return Ok(Part::Number(None));
    }
    let modulus = compact
        .strip_prefix("n%")
        .and_then(|k| k.parse::<u64>().ok())
        .filter(|&k| k > 0)
        .ok_or_else(|| format!("unknown placeholder {{{inner}}}: use {{n}} or {{n % K}}, K > 0"))?;
    Ok(Part::Number(Some(modulus)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_numbers_and_modulos() {
        let t = Template::parse("u{n % 3}-{n}").unwrap();
        assert_eq!(t.render(7), "u1-7");
        assert_eq!(Template::parse("plain").unwrap().render(5), "plain");
    }

    #[test]
    fn several_placeholders_render_in_one_template() {
        let t = Template::parse("rl:u:u{n % 100},9 rl:ip:10.0.{n % 129}.{n % 256},9").unwrap();
        assert_eq!(t.render(300), "rl:u:u0,9 rl:ip:10.0.42.44,9");
    }

    #[test]
    fn doubled_braces_are_literal() {
        assert_eq!(Template::parse("{{x}} {n%2}").unwrap().render(3), "{x} 1");
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in ["{m}", "{n%0}", "{n", "a}", "{n%x}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }
}
