//! A number of hits as Envoy reads one: what a `hits_addend` format (`%REQ(x-max-tokens)%`)
//! made of a string becomes in the descriptor Envoy sends, or that Envoy sends none.
//!
//! A reservation's commit names what was reserved (`ratelimit.reserved: N`). When N is
//! the text of the same request header that sized the reservation, the bridge must read it
//! exactly as Envoy read it for the reservation, or a client chooses a header that the two
//! read differently (`2000000000`, which Envoy drops, so nothing is reserved; `0.5`, which
//! Envoy truncates to 0) and the commit gives back what was never taken. Envoy parses the
//! string with `absl::SimpleAtod` (ASCII whitespace around it, an optional sign, decimal
//! digits with a fraction and an exponent, `inf`, `nan`), drops the descriptor when that
//! fails or the value is negative or above 1e9, and truncates the rest.

/// The most hits Envoy sends for one descriptor from a format (`MAX_HITS_ADDEND`).
const ENVOY_MAX_HITS: f64 = 1e9;

/// The hits Envoy sends for the string `text` of a `hits_addend` format, `None` when it
/// sends no descriptor at all. `nan` reads as `None` too: Envoy's cast of it to an integer
/// is undefined, and no reading of it may count as reserved.
pub fn envoy_hits(text: &str) -> Option<u64> {
    // absl's whitespace: space, \t, \n, \v, \f, \r.
    let text = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'));
    // SimpleAtod takes one leading '+' (never "+-"); from_chars takes a '-'.
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned.starts_with(['+', '-']) && unsigned.len() != text.len() {
        return None;
    }
    let digits = unsigned.strip_prefix('-').unwrap_or(unsigned);
    let number = digits
        .bytes()
        .all(|b| b.is_ascii_digit() || b"eE.+-".contains(&b))
        && digits
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit() || b == b'.');
    let value: f64 = match (number, digits.to_ascii_lowercase().as_str()) {
        (true, _) => unsigned.parse().ok()?,
        (false, "inf" | "infinity") => f64::INFINITY,
        _ => return None,
    };
    // Envoy's range check, then `static_cast<uint64_t>`: truncation toward zero.
    // (NaN is in no range.)
    if !(0.0..=ENVOY_MAX_HITS).contains(&value) {
        return None;
    }
    Some(value.trunc() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_as_written_and_fractions_and_exponents_truncate() {
        for (text, hits) in [
            ("30", 30),
            ("0", 0),
            ("-0", 0),
            ("+7", 7),
            (" 30\t", 30),
            ("\x0b12\x0c", 12),
            ("0.5", 0),
            ("1e-3", 0),
            ("29.999", 29),
            ("1e3", 1000),
            ("1E9", 1_000_000_000),
            (".5", 0),
            ("5.", 5),
            ("007", 7),
        ] {
            assert_eq!(envoy_hits(text), Some(hits), "{text:?}");
        }
    }

    #[test]
    fn what_envoy_drops_reserves_nothing() {
        for text in [
            "2000000000",
            "1000000000.5",
            "1e10",
            "-1",
            "-0.5",
            "inf",
            "Infinity",
            "-inf",
            "nan",
            "NaN",
            "",
            " ",
            "+-1",
            "++1",
            "0x10",
            "1_000",
            "30,30",
            "thirty",
            "1e",
            "e3",
            ".",
            "30 30",
        ] {
            assert_eq!(envoy_hits(text), None, "{text:?}");
        }
    }
}
