//! Decimal numbers without `core::fmt`: the format machinery costs a few hundred wasm
//! instructions per number, and the filter writes several on every request.

/// `n` in decimal, written at the end of `buf` (no allocation).
pub fn format_u64(buf: &mut [u8; 20], mut n: u64) -> &str {
    let mut start = buf.len();
    loop {
        start -= 1;
        // `n % 10` is below 10: the cast keeps it.
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[start..]).unwrap_or_default()
}

/// Appends `n` in decimal.
pub fn push_u64(out: &mut String, n: u64) {
    out.push_str(format_u64(&mut [0; 20], n));
}

/// `n` in decimal.
pub fn u64_string(n: u64) -> String {
    let mut out = String::with_capacity(20);
    push_u64(&mut out, n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_display_does() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, 1 << 53, u64::MAX] {
            assert_eq!(u64_string(n), n.to_string());
        }
        let mut s = String::from("x=");
        push_u64(&mut s, 42);
        assert_eq!(s, "x=42");
        let mut buf = [0; 20];
        assert_eq!(format_u64(&mut buf, u64::MAX), u64::MAX.to_string());
        assert_eq!(format_u64(&mut buf, 7), "7");
    }
}
