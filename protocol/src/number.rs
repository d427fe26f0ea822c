//! Decimal numbers without `core::fmt`: the format machinery costs a few hundred wasm
//! instructions per number, and the filter writes several on every request.

/// `n`'s decimal digits, written at the end of `buf` (no allocation).
pub fn u64_digits(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
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
    &buf[start..]
}

/// Appends `n` in decimal.
pub fn push_u64(out: &mut String, n: u64) {
    for &digit in u64_digits(&mut [0; 20], n) {
        out.push(char::from(digit));
    }
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
        assert_eq!(
            u64_digits(&mut buf, u64::MAX),
            u64::MAX.to_string().as_bytes()
        );
        assert_eq!(u64_digits(&mut buf, 7), b"7");
    }
}
