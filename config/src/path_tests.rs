use super::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn normal(raw: &str) -> String {
    String::from_utf8(normalize(raw.as_bytes())).unwrap()
}

fn assert_cases(cases: &[(&str, &str)]) {
    for (raw, expected) in cases {
        assert_eq!(normal(raw), *expected, "normalize({raw:?})");
    }
}

#[test]
fn rfc_3986_removes_dot_segments_as_in_its_examples() {
    assert_cases(&[
        // Section 5.2.4's two walk-throughs.
        ("/a/b/c/./../../g", "/a/g"),
        ("mid/content=5/../6", "mid/6"),
        // Section 5.4's examples, as merged with the base path /b/c/d;p.
        ("/b/c/g", "/b/c/g"),
        ("/b/c/./g", "/b/c/g"),
        ("/b/c/g/", "/b/c/g/"),
        ("/b/c/.", "/b/c/"),
        ("/b/c/./", "/b/c/"),
        ("/b/c/..", "/b/"),
        ("/b/c/../", "/b/"),
        ("/b/c/../g", "/b/g"),
        ("/b/c/../..", "/"),
        ("/b/c/../../", "/"),
        ("/b/c/../../g", "/g"),
        ("/b/c/../../../g", "/g"),
        ("/b/c/../../../../g", "/g"),
        ("/./g", "/g"),
        ("/../g", "/g"),
        ("/b/c/g.", "/b/c/g."),
        ("/b/c/.g", "/b/c/.g"),
        ("/b/c/g..", "/b/c/g.."),
        ("/b/c/..g", "/b/c/..g"),
        ("/b/c/./../g", "/b/g"),
        ("/b/c/./g/.", "/b/c/g/"),
        ("/b/c/g/./h", "/b/c/g/h"),
        ("/b/c/g/../h", "/b/c/h"),
        ("/b/c/g;x=1/./y", "/b/c/g;x=1/y"),
        ("/b/c/g;x=1/../y", "/b/c/y"),
    ]);
}

/// The spellings of one path that the end-to-end test also sends through Envoy
/// (`testbed/tests/test_paths.py`): one list for both.
const SPELLINGS: &str = include_str!("../../testbed/data/path_spellings.json");

#[derive(serde::Deserialize)]
struct Spellings {
    path: String,
    spellings: Vec<String>,
}

#[test]
fn every_trick_of_issue_13_spells_the_same_path() {
    let Spellings { path, spellings } = serde_json::from_str(SPELLINGS).unwrap();
    assert!(spellings.len() >= 10, "{spellings:?}");
    // A fragment, which Envoy refuses before any filter sees it, and the path itself.
    let extra = ["/api/search#top", path.as_str()];
    for raw in spellings.iter().map(String::as_str).chain(extra) {
        assert_eq!(normal(raw), path, "normalize({raw:?})");
    }
}

#[test]
fn unreserved_escapes_are_decoded_and_the_others_kept_in_upper_case() {
    assert_cases(&[
        ("/%41", "/A"),
        ("/%7e%7E", "/~~"),
        ("/%2D%2e%5F%30%39%61%7A", "/-._09az"),
        ("/a%2fb", "/a%2Fb"),
        ("/a%2F%62", "/a%2Fb"),
        ("/%2f..", "/%2F.."),
        ("/x%3f%23%25", "/x%3F%23%25"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/%00%20%7f", "/%00%20%7F"),
    ]);
}

#[test]
fn malformed_escapes_stay_as_written() {
    assert_cases(&[
        ("/%", "/%"),
        ("/%zz", "/%zz"),
        ("/%4", "/%4"),
        ("/%4g", "/%4g"),
        ("/a%", "/a%"),
        ("/%%47", "/%G"),
        ("/%%", "/%%"),
    ]);
}

#[test]
fn a_decoded_hex_digit_never_completes_an_escape_with_a_stray_percent() {
    // Decoded, these would read %41 and %2e: a second pass would turn them into A and a dot.
    assert_cases(&[
        ("/%%34%31", "/%%341"),
        ("/%4%31", "/%4%31"),
        ("/%2%65/x", "/%2%65/x"),
        ("/%%34", "/%%34"),
        ("/%%41", "/%%41"),
        ("/%~%34", "/%~4"),
    ]);
}

#[test]
fn edges_of_the_root_and_of_segments() {
    assert_cases(&[
        ("", ""),
        ("/", "/"),
        ("//", "/"),
        ("/.", "/"),
        ("/..", "/"),
        ("/../..", "/"),
        ("/a/..", "/"),
        ("/a/.", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/a/b/..", "/a/"),
        ("/a//", "/a/"),
        ("/...", "/..."),
        ("?", ""),
        ("/?/..", "/"),
    ]);
}

#[test]
fn relative_paths_follow_rfc_3986_too() {
    // Envoy refuses them; other hosts may not.
    assert_cases(&[
        (".", ""),
        ("..", ""),
        ("../a", "a"),
        ("./a", "a"),
        (".//a", "a"),
        ("a/..", "/"),
        ("a/../b", "/b"),
        ("a/b/../../c", "/c"),
        ("a/b/..", "a/"),
        ("*", "*"),
    ]);
}

#[test]
fn other_bytes_pass_through_untouched() {
    assert_cases(&[
        ("/a\\..\\b", "/a\\..\\b"),
        ("/\\/..", "/"),
        ("/café/ü/../x", "/café/x"),
        ("/a;b=c,d+e", "/a;b=c,d+e"),
    ]);
    assert_eq!(
        normalize(b"/\xff\xfe/./\x00/../\xc3"),
        b"/\xff\xfe/\xc3".to_vec()
    );
}

#[test]
fn long_hostile_paths_take_one_pass() {
    // Work growing with the square of the length (say, rescanning the output from its
    // start on each `..`) would take minutes here.
    let mut raw = b"/a".repeat(300_000);
    raw.extend(b"/%2e%2E".repeat(300_000));
    raw.extend(b"//".repeat(300_000));
    assert_eq!(normalize(&raw), b"/");
    let strays = b"%".repeat(300_000);
    let normal = [&b"/"[..], &strays, b"%34", &b"4".repeat(299_999)].concat();
    let raw = [&b"/"[..], &strays, &b"%34".repeat(300_000)].concat();
    assert_eq!(normalize(&raw), normal);
}

/// Pieces that matter to normalization (space-separated), short enough to meet in every
/// combination.
const PIECES: &[u8] =
    b"/ / . .. % %2e %2E %2f %34 %31 %41 %61 %7e %zz 2 4 e a ~ ? # \\ \xc3\xa9 \xff";

/// Up to a dozen pieces, now and then any byte at all, rooted or not.
fn paths() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        9 => prop::sample::select(PIECES.split(|&b| b == b' ').collect::<Vec<_>>())
            .prop_map(<[u8]>::to_vec),
        1 => any::<u8>().prop_map(|b| vec![b]),
    ];
    (any::<bool>(), prop::collection::vec(piece, 0..12)).prop_map(|(rooted, pieces)| {
        let root: &[u8] = if rooted { b"/" } else { b"" };
        [root, &pieces.concat()].concat()
    })
}

#[test]
fn random_bytes_normalize_once_and_for_all_into_clean_paths() {
    // A fixed seed: the same paths every run, a failing one shrunk and reported.
    let config = Config {
        cases: 5000,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let outcome = runner.run(&paths(), |raw| {
        let out = normalize(&raw);
        let shown = String::from_utf8_lossy(&raw);
        prop_assert_eq!(&normalize(&out), &out, "not idempotent on {:?}", shown);
        for bad in [&b"//"[..], b"/./", b"/../", b"?", b"#"] {
            prop_assert!(
                !out.windows(bad.len()).any(|w| w == bad),
                "{:?} in the normal form of {:?}",
                bad,
                shown
            );
        }
        prop_assert!(
            !out.ends_with(b"/.") && !out.ends_with(b"/.."),
            "{:?}",
            shown
        );
        prop_assert!(
            !out.starts_with(b"./") && !out.starts_with(b"../"),
            "{:?}",
            shown
        );
        prop_assert!(out != b"." && out != b"..", "{:?}", shown);
        prop_assert!(
            !raw.starts_with(b"/") || out.starts_with(b"/"),
            "{:?}",
            shown
        );
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
