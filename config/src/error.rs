//! The error every part of the configuration reports: the JSON path of the field at fault
//! and what is wrong with it. Its own module so that the parts (limits, backend) and the
//! whole (config) all use it without importing each other.

use std::fmt;

/// A configuration error, e.g. `rules[0].limit.per: "soon" is not a duration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

/// What the JSON parser says of a value of the wrong type or an unknown name, in the words
/// of the configuration rather than of Rust: `invalid type: string "10", expected u64 at
/// line 1 column 42` becomes `"10" is a string, expected a whole number, 0 or more (line 1,
/// column 42)`. The gateway logs it and `ratelimit-bridge check-config` prints it.
pub fn plain(parser_message: &str) -> String {
    let (message, at) = match parser_message.rsplit_once(" at line ") {
        Some((message, place)) => match place.split_once(" column ") {
            Some((line, column)) => (message, format!(" (line {line}, column {column})")),
            None => (parser_message, String::new()),
        },
        None => (parser_message, String::new()),
    };
    let mut out = message.to_string();
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            out = match literal(found) {
                Some(v) => format!("{v} is {}, expected {}", kind(found), kind(expected)),
                None => format!("expected {}, found {}", kind(expected), kind(found)),
            };
        }
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        // "unknown variant `fail`, expected `skip` or `deny`": quoted as JSON writes them.
        let quoted = rest.replace('`', "\"");
        if let Some((found, expected)) = quoted.split_once(", expected ") {
            out = format!("expected {expected}, found {found}");
        }
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            let found = literal(found).unwrap_or(found);
            out = format!("{found} is not {}", kind(expected));
        }
    }
    out + &at
}

/// The value in a parser's description of one: `string "10"` -> `"10"`, ``integer `-1` ``
/// -> `-1`; `None` for a kind alone (`map`).
fn literal(found: &str) -> Option<&str> {
    if let Some((_, quoted)) = found.split_once('`') {
        return quoted.strip_suffix('`');
    }
    found.find('"').map(|at| &found[at..])
}

/// A type as the parser names it (`u64`, `a sequence`, `struct Limit`, `floating point
/// `1.5``), as a configuration's reader would.
fn kind(name: &str) -> &str {
    let bare = name
        .strip_prefix("a ")
        .or_else(|| name.strip_prefix("an "))
        .unwrap_or(name);
    match bare.split(' ').next().unwrap_or(bare) {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "integer" => "a whole number",
        "f32" | "f64" | "floating" => "a number",
        "string" | "str" | "borrowed" | "char" => "a string",
        "boolean" | "bool" => "true or false",
        "sequence" | "tuple" => "a list",
        "map" | "struct" => "an object",
        "null" | "unit" | "option" => "null",
        _ => name,
    }
}

/// `Err(ConfigError)` for `field`.
pub fn err<T>(field: impl Into<String>, problem: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field: field.into(),
        problem: problem.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn the_parsers_types_are_named_as_the_configuration_has_them() {
        assert_eq!(
            plain("invalid type: string \"10\", expected u64 at line 1 column 42"),
            "\"10\" is a string, expected a whole number, 0 or more (line 1, column 42)"
        );
        assert_eq!(
            plain("unknown variant `fail`, expected `skip` or `deny` at line 1 column 75"),
            "expected \"skip\" or \"deny\", found \"fail\" (line 1, column 75)"
        );
        assert_eq!(
            plain("invalid value: integer `-1`, expected u64"),
            "-1 is not a whole number, 0 or more"
        );
        assert_eq!(
            plain("invalid type: map, expected a sequence at line 3 column 9"),
            "expected a list, found an object (line 3, column 9)"
        );
        assert_eq!(
            plain("invalid type: string \"x\", expected struct Limit"),
            "\"x\" is a string, expected an object"
        );
        assert_eq!(
            plain("invalid type: floating point `1.5`, expected u32"),
            "1.5 is a number, expected a whole number, 0 or more"
        );
        // Messages that already speak the configuration's words stay as they are.
        assert_eq!(
            plain("unknown field `zz`, expected one of `a`, `b`"),
            "unknown field `zz`, expected one of `a`, `b`"
        );
    }
}
