//! Decimal numbers without `core::fmt`: the format machinery costs a few hundred wasm
//! instructions per number, and the filter writes several on every request.

/// Appends `n` in decimal.
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        // `n % 10` is below 10: the cast keeps it.
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[start..] {
        out.push(char::from(d));
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
    }
}
