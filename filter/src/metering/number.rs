//! A JSON number, read a byte at a time: its grammar (RFC 8259), and whether it is a
//! usable count.
//!
//! Its digits are added up as they come, and not kept: once the count is above
//! `MAX_COUNT` it stops growing, so a number of any length costs nothing and is out of
//! range. A number ends only at what may follow a value (`,`, `]`, `}`, whitespace), or
//! where the input ends; anything else makes it malformed, so that `0x1` is not a 0.

/// The largest usable count: every count up to it is exact in a JSON reader using doubles.
pub const MAX_COUNT: u64 = 1 << 53;

/// Where in a number's grammar the reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Minus,
    Zero,
    Int,
    FracStart,
    Frac,
    ExpStart,
    ExpSign,
    Exp,
}

/// What a byte did to the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Taken: the number goes on.
    More,
    /// Not taken: the number ended before it.
    Ended,
    /// The number is malformed.
    Malformed,
}

#[derive(Debug)]
pub(super) struct Number {
    part: Part,
    negative: bool,
    /// The integer digits so far, stopped once above `MAX_COUNT`.
    count: u64,
}

impl Number {
    pub(super) fn new() -> Number {
        Number {
            part: Part::Zero,
            negative: false,
            count: 0,
        }
    }

    /// A number starting at `first`, which the caller found to be `-` or a digit.
    pub(super) fn start(&mut self, first: u8) {
        self.negative = first == b'-';
        self.count = match first {
            b'0'..=b'9' => u64::from(first - b'0'),
            _ => 0,
        };
        self.part = match first {
            b'-' => Part::Minus,
            b'0' => Part::Zero,
            _ => Part::Int,
        };
    }

    /// Reads on through `bytes`: how many it took, and why it stopped.
    pub(super) fn run(&mut self, bytes: &[u8]) -> (usize, Next) {
        for (taken, &b) in bytes.iter().enumerate() {
            match self.step(b) {
                Next::More => {}
                stop => return (taken, stop),
            }
        }
        (bytes.len(), Next::More)
    }

    fn step(&mut self, b: u8) -> Next {
        self.part = match (self.part, b) {
            (Part::Int, b'0'..=b'9') => {
                if self.count <= MAX_COUNT {
                    self.count = self.count * 10 + u64::from(b - b'0');
                }
                Part::Int
            }
            (Part::Minus, b'0') => Part::Zero,
            (Part::Minus, b'1'..=b'9') => {
                self.count = u64::from(b - b'0');
                Part::Int
            }
            (Part::Zero | Part::Int, b'.') => Part::FracStart,
            (Part::Zero | Part::Int | Part::Frac, b'e' | b'E') => Part::ExpStart,
            (Part::FracStart | Part::Frac, b'0'..=b'9') => Part::Frac,
            (Part::ExpStart, b'+' | b'-') => Part::ExpSign,
            (Part::ExpStart | Part::ExpSign | Part::Exp, b'0'..=b'9') => Part::Exp,
            (_, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') if self.complete() => {
                return Next::Ended
            }
            _ => return Next::Malformed,
        };
        Next::More
    }

    /// True when the number may end here: it has its digits, and no `.`, `e` or sign is
    /// waiting for more.
    pub(super) fn complete(&self) -> bool {
        matches!(self.part, Part::Zero | Part::Int | Part::Frac | Part::Exp)
    }

    /// The count, if the number is a usable one: an integer from 0 (`-0` too) to
    /// `MAX_COUNT`, without fraction or exponent.
    pub(super) fn count(&self) -> Option<u64> {
        let integer = matches!(self.part, Part::Zero | Part::Int);
        let usable = integer && (!self.negative || self.count == 0) && self.count <= MAX_COUNT;
        usable.then_some(self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` then a comma: its count, or why not.
    fn read(text: &str) -> Result<Option<u64>, &'static str> {
        let mut number = Number::new();
        let bytes = text.as_bytes();
        number.start(bytes[0]);
        match number.run(&[&bytes[1..], b","].concat()) {
            (taken, Next::Ended) if taken == bytes.len() - 1 => Ok(number.count()),
            (_, Next::Malformed) => Err("malformed"),
            _ => Err("ended early"),
        }
    }

    #[test]
    fn integers_up_to_two_to_the_53_are_counts_and_minus_zero_is_zero() {
        assert_eq!(read("0"), Ok(Some(0)));
        assert_eq!(read("-0"), Ok(Some(0)));
        assert_eq!(read("7"), Ok(Some(7)));
        assert_eq!(read("1234567890"), Ok(Some(1_234_567_890)));
        assert_eq!(read("9007199254740992"), Ok(Some(MAX_COUNT)));
    }

    #[test]
    fn numbers_that_are_not_counts_are_read_but_have_no_count() {
        for text in [
            "-1",
            "9007199254740993",
            "99999999999999999999999",
            "1.5",
            "0.0",
        ] {
            assert_eq!(read(text), Ok(None), "{text}");
        }
        for text in ["-0.0", "1e3", "1E+3", "1e-3", "0e0", "2.5E10"] {
            assert_eq!(read(text), Ok(None), "{text}");
        }
    }

    #[test]
    fn bytes_outside_the_grammar_make_a_number_malformed() {
        for text in [
            "01", "-", "-a", "1.", "1.e3", "1e", "1e+", "0x1", "1-2", "--1", "1.2.3",
        ] {
            assert_eq!(read(text), Err("malformed"), "{text}");
        }
    }

    #[test]
    fn a_number_ends_at_whatever_may_follow_a_value_and_only_there() {
        for end in [b',', b']', b'}', b' ', b'\t', b'\n', b'\r'] {
            let mut number = Number::new();
            number.start(b'4');
            assert_eq!(number.run(&[b'2', end, b'x']), (1, Next::Ended));
            assert_eq!(number.count(), Some(42));
        }
        let mut number = Number::new();
        number.start(b'4');
        assert_eq!(number.run(b"2"), (1, Next::More));
        assert!(number.complete(), "42 may end with the input");
    }
}
