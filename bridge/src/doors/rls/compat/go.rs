//! Go's readings of text, as envoyproxy/ratelimit makes them of its environment through
//! kelseyhightower/envconfig: one function per Go type, each accepting exactly what Go's
//! own function accepts and refusing the rest. A value that service reads one way must not
//! be read another here: `T` is Go's `true`, and a bridge that read it as false served a
//! TLS deployment in plaintext. Ported from Go's `strconv` (atoi.go, atof.go) and `time`
//! (format.go); the errors say what Go would take instead.

/// `strconv.ParseBool`.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(
            "not a boolean to Go's strconv.ParseBool (1, t, T, TRUE, true, True, \
                  0, f, F, FALSE, false or False)"
                .into(),
        ),
    }
}

/// `strconv.ParseInt(text, 0, bits)`, as envconfig reads every signed integer (`time.Duration`
/// aside): an optional sign, then decimal, `0x`/`0o`/`0b` or a leading `0` for octal, `_`
/// between digits, within `bits` bits.
pub fn parse_int(text: &str, bits: u32) -> Result<i64, String> {
    let (negative, magnitude) = match text.as_bytes().first() {
        Some(b'+') => (false, text.get(1..).unwrap_or_default()),
        Some(b'-') => (true, text.get(1..).unwrap_or_default()),
        _ => (false, text),
    };
    let n = parse_uint(magnitude).ok_or_else(|| {
        "not an integer to Go's strconv.ParseInt (base 0: decimal, 0x, 0o, 0b or a leading 0 \
         for octal)"
            .to_owned()
    })?;
    let cutoff = 1u128 << (bits.clamp(1, 64) - 1);
    let n = u128::from(n.unwrap_or(u64::MAX));
    if (!negative && n >= cutoff) || (negative && n > cutoff) {
        return Err(format!("out of range for Go's {bits}-bit integer"));
    }
    let n = i128::try_from(n).unwrap_or_default();
    i64::try_from(if negative { -n } else { n }).map_err(|_| "out of range".to_owned())
}

/// `strconv.ParseUint(text, 0, 64)`'s digits: `None` where it finds no number,
/// `Some(None)` where the number passes 64 bits.
fn parse_uint(text: &str) -> Option<Option<u64>> {
    let bytes = text.as_bytes();
    let (base, digits): (u32, &[u8]) = match bytes {
        [] => return None,
        [b'0', x, _, ..] if x.eq_ignore_ascii_case(&b'b') => (2, &bytes[2..]),
        [b'0', x, _, ..] if x.eq_ignore_ascii_case(&b'o') => (8, &bytes[2..]),
        [b'0', x, _, ..] if x.eq_ignore_ascii_case(&b'x') => (16, &bytes[2..]),
        [b'0', rest @ ..] => (8, rest),
        _ => (10, bytes),
    };
    let mut n: Option<u64> = Some(0);
    let mut underscores = false;
    for &b in digits {
        if b == b'_' {
            underscores = true;
            continue;
        }
        let digit = char::from(b).to_digit(36)?;
        if digit >= base {
            return None;
        }
        n = n
            .and_then(|n| n.checked_mul(u64::from(base)))
            .and_then(|n| n.checked_add(u64::from(digit)));
        if n.is_none() {
            // Go stops at the first digit past the range: a range error, whatever follows.
            return Some(None);
        }
    }
    if underscores && !underscores_ok(text) {
        return None;
    }
    Some(n)
}

/// Go's `underscoreOK`: `_` only between digits, or between a base prefix and a digit.
fn underscores_ok(text: &str) -> bool {
    let mut s = text.as_bytes();
    if let [b'+' | b'-', rest @ ..] = s {
        s = rest;
    }
    // What came last: '^' the start, '0' a digit or base prefix, '_', '!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    if let [b'0', x, rest @ ..] = s {
        if matches!(x.to_ascii_lowercase(), b'b' | b'o' | b'x') {
            hex = x.eq_ignore_ascii_case(&b'x');
            saw = b'0';
            s = rest;
        }
    }
    for &b in s {
        if b.is_ascii_digit() || (hex && b.is_ascii_hexdigit()) {
            saw = b'0';
        } else if b == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// `strconv.ParseFloat(text, bits)`: Go's decimal and hexadecimal float literals (with `_`
/// as Go places it), `inf`/`infinity`/`nan` in any case (signed but for `nan`), refused
/// where the value overflows `bits` bits. A hexadecimal value's range is judged as f64
/// arithmetic rounds it, which differs from Go's only within an ulp of the largest float.
pub fn parse_float(text: &str, bits: u32) -> Result<f64, String> {
    let refused = || {
        "not a number to Go's strconv.ParseFloat (decimal or 0x…p… hexadecimal, inf, nan)"
            .to_owned()
    };
    if let Some(special) = special(text) {
        return Ok(special);
    }
    let value = read_float(text.as_bytes()).ok_or_else(refused)?;
    let overflows = if bits == 32 {
        value.is_infinite() || (value as f32).is_infinite()
    } else {
        value.is_infinite()
    };
    if overflows {
        return Err(format!("out of range for Go's float{bits}"));
    }
    Ok(value)
}

/// Go's `special`, whole: `[+-]?(inf|infinity)` or `nan`, in any case.
fn special(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    let (sign, unsigned) = match lower.as_bytes().first() {
        Some(b'+') => (1.0, &lower[1..]),
        Some(b'-') => (-1.0, &lower[1..]),
        _ if lower == "nan" => return Some(f64::NAN),
        _ => (1.0, lower.as_str()),
    };
    matches!(unsigned, "inf" | "infinity").then_some(sign * f64::INFINITY)
}

/// Go's `readFloat` over the whole text, and the value: `None` where Go finds no number
/// or finds one that does not end the text.
fn read_float(s: &[u8]) -> Option<f64> {
    let mut i = 0;
    let negative = s.first() == Some(&b'-');
    if matches!(s.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    let hex = s.len() > i + 2 && s[i] == b'0' && s[i + 1].eq_ignore_ascii_case(&b'x');
    if hex {
        i += 2;
    }
    let (mut underscores, mut dot, mut digits) = (false, false, false);
    let (mut mantissa, mut fraction_digits) = (0f64, 0i64);
    let mut decimal = String::new();
    while let Some(&b) = s.get(i) {
        let digit = if hex {
            char::from(b).to_digit(16)
        } else {
            char::from(b).to_digit(10)
        };
        match (b, digit) {
            (b'_', _) => underscores = true,
            (b'.', _) if dot => break,
            (b'.', _) => {
                dot = true;
                decimal.push('.');
            }
            (_, Some(d)) => {
                digits = true;
                mantissa = mantissa * 16.0 + f64::from(d);
                fraction_digits += i64::from(dot);
                decimal.push(char::from(b));
            }
            _ => break,
        }
        i += 1;
    }
    if !digits {
        return None;
    }
    let exponent_mark = if hex { b'p' } else { b'e' };
    let mut exponent = 0i64;
    if s.get(i)
        .is_some_and(|b| b.eq_ignore_ascii_case(&exponent_mark))
    {
        i += 1;
        let mut sign = 1;
        match s.get(i) {
            Some(b'+') => i += 1,
            Some(b'-') => (sign, i) = (-1, i + 1),
            _ => {}
        }
        if !s.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while let Some(&b) = s.get(i).filter(|b| b.is_ascii_digit() || **b == b'_') {
            if b == b'_' {
                underscores = true;
            } else if exponent < 100_000 {
                exponent = exponent * 10 + i64::from(b - b'0');
            }
            i += 1;
        }
        exponent *= sign;
    } else if hex {
        return None;
    }
    if i != s.len() || (underscores && !underscores_ok(std::str::from_utf8(s).ok()?)) {
        return None;
    }
    let value = if hex {
        let shift = i32::try_from(exponent - 4 * fraction_digits).ok()?;
        mantissa * 2f64.powi(shift.clamp(-2200, 2200))
    } else {
        format!("{decimal}e{exponent}").parse::<f64>().ok()?
    };
    Some(if negative { -value } else { value })
}

/// `time.ParseDuration`, in nanoseconds: `[-+]?([0-9]*(\.[0-9]*)?unit)+` or `0`, units
/// `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`, within an `int64` of nanoseconds.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let refused = || {
        "not a duration to Go's time.ParseDuration (such as 300ms, 1.5h or 2h45m; units \
         ns, us, µs, ms, s, m, h)"
            .to_owned()
    };
    let mut s = text.as_bytes();
    let mut negative = false;
    if let [sign @ (b'+' | b'-'), rest @ ..] = s {
        negative = *sign == b'-';
        s = rest;
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(refused());
    }
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(refused());
        }
        let before = s.len();
        let mut whole: u64 = 0;
        while let Some(&b) = s.first().filter(|b| b.is_ascii_digit()) {
            if whole > LIMIT / 10 {
                return Err(refused());
            }
            whole = whole * 10 + u64::from(b - b'0');
            if whole > LIMIT {
                return Err(refused());
            }
            s = &s[1..];
        }
        let pre = s.len() != before;
        let (mut fraction, mut scale, mut post) = (0u64, 1f64, false);
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let mut overflow = false;
            while let Some(&b) = s.first().filter(|b| b.is_ascii_digit()) {
                post = true;
                s = &s[1..];
                // As Go: past 63 bits the fraction only stops gaining precision.
                if overflow || fraction > (LIMIT - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let next = fraction * 10 + u64::from(b - b'0');
                if next > LIMIT {
                    overflow = true;
                    continue;
                }
                fraction = next;
                scale *= 10.0;
            }
        }
        if !pre && !post {
            return Err(refused());
        }
        let unit_len = s
            .iter()
            .position(|b| *b == b'.' || b.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(refused());
        }
        let unit: u64 = match &s[..unit_len] {
            b"ns" => 1,
            // `us`, and `µs` with the micro sign (U+00B5) or the Greek mu (U+03BC).
            b"us" | b"\xC2\xB5s" | b"\xCE\xBCs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return Err(refused()),
        };
        s = &s[unit_len..];
        if whole > LIMIT / unit {
            return Err(refused());
        }
        let mut v = whole * unit;
        if fraction > 0 {
            v += (fraction as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(refused());
            }
        }
        total += v;
        if total > LIMIT {
            return Err(refused());
        }
    }
    if negative {
        return Ok(0i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).map_err(|_| refused())
}

/// envconfig's `map[string]string`: empty (or all spaces) is no entry; else
/// `key:value` pairs, comma-separated, each of exactly one `:`.
pub fn parse_map(text: &str) -> Result<Vec<(String, String)>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|pair| match pair.split(':').collect::<Vec<_>>()[..] {
            [key, value] => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!(
                "{pair:?} is no key:value pair to envconfig's map (key:value,key:value)"
            )),
        })
        .collect()
}

#[cfg(test)]
#[path = "go_tests.rs"]
mod tests;
