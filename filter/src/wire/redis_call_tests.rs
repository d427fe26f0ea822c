use super::*;

use ratelimit_protocol::script::SHAPE_LEN;

const BODY: &str = "rl:a:x,10,1,6000,1 rl:g,5,50,1,2\nrl:b,10,1,6000,1\n";

/// The bulk strings of a RESP array of bulk strings.
fn bulks(query: &[u8]) -> Vec<Vec<u8>> {
    let mut cursor = Cursor { rest: query };
    let (b'*', n) = cursor.line().unwrap() else {
        panic!("not an array")
    };
    let n: usize = std::str::from_utf8(n).unwrap().parse().unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let (b'$', len) = cursor.line().unwrap() else {
            panic!("not a bulk string")
        };
        let len: usize = std::str::from_utf8(len).unwrap().parse().unwrap();
        out.push(cursor.rest[..len].to_vec());
        assert_eq!(&cursor.rest[len..len + 2], b"\r\n");
        cursor.rest = &cursor.rest[len + 2..];
    }
    assert!(cursor.rest.is_empty());
    out
}

#[test]
fn a_batch_becomes_one_evalsha_laid_out_as_the_bridge_lays_it_out() {
    let args = bulks(&script_query(BODY, Invoke::Sha).unwrap());
    let text: Vec<String> = args[..16]
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(text[0], "EVALSHA");
    assert_eq!(text[1], script_sha1());
    assert_eq!(text[2..7], ["3", "rl:a:x", "rl:g", "rl:b", "check"]);
    assert_eq!(text[7], "2", "two shapes: rl:b shares rl:a:x's");
    assert_eq!(text[8..12], ["10", "1", "6000", "1"]);
    // Two parts: two rules of shapes 1 and 2, then one of shape 1.
    assert_eq!(args[args.len() - 2], &[2, 1, 2, 1, 1]);
    assert_eq!(args.last().unwrap(), b"", "no settlement nor slot: no id");
    assert_eq!(args.len(), 3 + 3 + 2 + 2 * SHAPE_LEN + 2);
}

#[test]
fn the_script_is_named_by_its_sha1_or_sent_whole_after_noscript() {
    // The SHA1 Redis computes for the script: 40 lowercase hex digits of it.
    let sha = script_sha1();
    assert_eq!(sha.len(), 40);
    assert!(sha
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let args = bulks(&script_query(BODY, Invoke::Text).unwrap());
    assert_eq!(args[0], b"EVAL");
    assert_eq!(args[1], TOKEN_BUCKET_LUA.as_bytes());
    assert!(is_noscript(b"-NOSCRIPT No matching script.\r\n"));
    assert!(!is_noscript(b"-ERR other\r\n"));
}

#[test]
fn lease_returns_are_a_refund_call_and_never_share_one_with_checks() {
    let args = bulks(&script_query("+ rl:a,10,1,1,3\n", Invoke::Sha).unwrap());
    assert_eq!(args[4], b"refund");
    assert!(script_query("rl:a,10,1,1,1\n+ rl:a,10,1,1,3\n", Invoke::Sha).is_err());
    assert!(script_query("", Invoke::Sha).is_err());
    assert!(script_query("bad line\n", Invoke::Sha).is_err());
}

/// The script's reply: its integers packed into one RESP bulk string.
fn packed(values: &[i64]) -> Vec<u8> {
    let mut out = format!("${}\r\n", values.len() * 8).into_bytes();
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[test]
fn a_reply_answers_each_check_with_the_bridge_s_results() {
    let reply = packed(&[1000, 9, 6000, 0, 4, 20, 0, 0, 6000, 600, -1, -1, -1]);
    let results = decode_reply(&reply, Mode::Check, &[2, 1, 1]).unwrap();
    let CheckResult::Checked { now_ms, rules } = &results[0] else {
        panic!("{results:?}")
    };
    assert_eq!(*now_ms, 1000);
    assert!(rules[0].allowed && rules[1].allowed);
    assert_eq!((rules[0].remaining, rules[1].remaining), (9, 4));
    let CheckResult::Checked { rules, .. } = &results[1] else {
        panic!("{results:?}")
    };
    assert!(!rules[0].allowed);
    assert_eq!(rules[0].wait_ms, 600);
    assert_eq!(
        results[2],
        CheckResult::Failed(script::FOREIGN_VALUE.into()),
        "a foreign value fails its own check only"
    );
}

#[test]
fn anything_but_the_exact_string_of_integers_fails_the_exchange() {
    let good = packed(&[1000, 9, 6000, 0]);
    assert!(decode_reply(&good, Mode::Check, &[1]).is_ok());
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("error", b"-ERR boom\r\n".to_vec()),
        (
            "crossslot",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec(),
        ),
        ("integer", b":5\r\n".to_vec()),
        ("status", b"+OK\r\n".to_vec()),
        ("nil", b"$-1\r\n".to_vec()),
        ("array", b"*4\r\n:1000\r\n:9\r\n:6000\r\n:0\r\n".to_vec()),
        ("short", packed(&[1000, 9, 6000])),
        ("long", packed(&[1000, 9, 6000, 0, 1])),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("no end", good[..good.len() - 2].to_vec()),
        ("trailing", [good.clone(), b":1\r\n".to_vec()].concat()),
        (
            "length past the bytes",
            [b"$40".to_vec(), good[3..].to_vec()].concat(),
        ),
        (
            "odd length",
            [b"$31\r\n".to_vec(), good[5..36].to_vec(), b"\r\n".to_vec()].concat(),
        ),
        ("huge length", b"$99999999999999999999\r\n".to_vec()),
        ("negative length", b"$-32\r\n".to_vec()),
        ("plus sign", [b"$+32".to_vec(), good[3..].to_vec()].concat()),
        ("negative time", packed(&[-5, 9, 6000, 0])),
        ("binary", b"\xff\xfe\r\n".to_vec()),
        ("too long", vec![b'$'; MAX_REPLY_LEN + 1]),
    ];
    for (name, reply) in bad {
        assert!(decode_reply(&reply, Mode::Check, &[1]).is_err(), "{name}");
    }
    let e = decode_reply(b"-ERR \x00bad\r\n", Mode::Check, &[1]).unwrap_err();
    assert_eq!(e, "redis: ERR ?bad");
    assert!(decode_reply(&good, Mode::Check, &[usize::MAX]).is_err());
}
