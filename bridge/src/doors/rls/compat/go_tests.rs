//! Each grammar against what Go's own functions answer (Go 1.24's strconv and time, as
//! their documentation and tests state them).

use super::*;

#[test]
fn booleans_are_go_strconv_parse_bools() {
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(parse_bool(yes), Ok(true), "{yes}");
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(parse_bool(no), Ok(false), "{no}");
    }
    for refused in [
        "", "yes", "no", "on", "off", "y", "n", "tRUE", "TrUe", "fALSE", " true", "true ", "01",
        "2", "-1", "Yes", "enabled",
    ] {
        assert!(parse_bool(refused).is_err(), "{refused:?}");
    }
}

#[test]
fn integers_are_go_strconv_parse_int_in_base_0() {
    for (text, n) in [
        ("0", 0),
        ("8081", 8081),
        ("+8081", 8081),
        ("-8081", -8081),
        ("-0", 0),
        ("0x1F91", 8081),
        ("0X1f91", 8081),
        ("0o17621", 8081),
        ("0O17621", 8081),
        ("017621", 8081),
        ("0b1111110010001", 8081),
        ("0B1", 1),
        ("8_081", 8081),
        ("0x_1F_91", 8081),
        ("0_17621", 8081),
        ("00", 0),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775808", i64::MIN),
        ("0x7fffffffffffffff", i64::MAX),
    ] {
        assert_eq!(parse_int(text, 64), Ok(n), "{text}");
    }
    for refused in [
        "",
        "+",
        "-",
        " 1",
        "1 ",
        "1.0",
        "1e3",
        "08081",
        "09",
        "0x",
        "0b",
        "0o",
        "0x1g",
        "0b2",
        "_1",
        "1_",
        "1__0",
        "0x_",
        "+-1",
        "--1",
        "١",
        "9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999999",
        "0x8000000000000000",
    ] {
        assert!(parse_int(refused, 64).is_err(), "{refused:?}");
    }
    assert_eq!(parse_int("127", 8), Ok(127));
    assert!(parse_int("128", 8).is_err());
    assert_eq!(parse_int("-128", 8), Ok(-128));
}

#[test]
fn floats_are_go_strconv_parse_float() {
    for (text, x) in [
        ("0.8", 0.8),
        ("1", 1.0),
        ("+1.5", 1.5),
        ("-1.5", -1.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("1e3", 1000.0),
        ("1E+3", 1000.0),
        ("1e-3", 0.001),
        ("1_000.5", 1000.5),
        ("1e1_0", 1e10),
        ("0x1p-2", 0.25),
        ("0X1.8P1", 3.0),
        ("0x.8p1", 1.0),
        ("0x_1p0", 1.0),
        ("1e-400", 0.0),
        ("007", 7.0),
    ] {
        assert_eq!(parse_float(text, 64), Ok(x), "{text}");
    }
    for inf in ["inf", "+Inf", "INFINITY", "-infinity", "+iNf"] {
        assert!(parse_float(inf, 64).is_ok_and(f64::is_infinite), "{inf}");
    }
    for nan in ["nan", "NaN", "NAN"] {
        assert!(parse_float(nan, 64).is_ok_and(f64::is_nan), "{nan}");
    }
    for refused in [
        "", ".", "+", "e3", "1e", "1e+", "1.5.5", "1,5", " 1", "1 ", "+nan", "-nan", "infin",
        "infx", "0x1", "0x1.8", "0x", "1p3", "_1", "1_", "1__0", "1_.5", "1._5", "1e_1", "0x1p",
        "1e400", "-1e400", "1f",
    ] {
        assert!(parse_float(refused, 64).is_err(), "{refused:?}");
    }
    assert!(parse_float("1e39", 32).is_err(), "past float32");
    assert!(parse_float("3.4e38", 32).is_ok());
    assert!(parse_float("1e39", 64).is_ok());
}

#[test]
fn durations_are_go_time_parse_duration() {
    const S: i64 = 1_000_000_000;
    for (text, ns) in [
        ("0", 0),
        ("+0", 0),
        ("-0", 0),
        ("5s", 5 * S),
        ("+5s", 5 * S),
        ("-5s", -5 * S),
        ("1.5h", 5400 * S),
        ("2h45m", 9900 * S),
        ("300ms", 300_000_000),
        ("10us", 10_000),
        ("10µs", 10_000),
        ("10μs", 10_000),
        ("7ns", 7),
        (".5s", S / 2),
        ("1.s", S),
        ("1h1m1s1ms1us1ns", 3_661_001_001_001),
        ("0s", 0),
        ("0.0000000001s", 0),
        ("9223372036854775807ns", i64::MAX),
        ("-9223372036854775808ns", i64::MIN),
    ] {
        assert_eq!(parse_duration(text), Ok(ns), "{text}");
    }
    for refused in [
        "",
        "+",
        "-",
        "10",
        "1",
        "00",
        "s",
        ".s",
        "-.s",
        "1.5",
        "1d",
        "1w",
        "1S",
        "1H",
        "1sec",
        " 1s",
        "1s ",
        "1 s",
        "1e3s",
        "1_000s",
        "--1s",
        "9223372036854775808ns",
        "2562048h",
        "1h-1m",
    ] {
        assert!(parse_duration(refused).is_err(), "{refused:?}");
    }
}

#[test]
fn maps_are_envconfigs_key_value_pairs() {
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(parse_map(""), Ok(vec![]));
    assert_eq!(parse_map("  "), Ok(vec![]));
    assert_eq!(
        parse_map("a:b,c:d"),
        Ok(vec![pair("a", "b"), pair("c", "d")])
    );
    assert_eq!(parse_map("a:"), Ok(vec![pair("a", "")]));
    assert_eq!(parse_map(" a : b "), Ok(vec![pair(" a ", " b ")]));
    for refused in ["a", "a:b:c", "a:b,", ",", "a=b", "x-header:http://h"] {
        assert!(parse_map(refused).is_err(), "{refused:?}");
    }
}
