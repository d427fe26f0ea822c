//! A global rule's terms, as the filter writes them on a rule of a check and the bridge
//! reads them: which region's Redis holds the key's ledger (its *home*), what a region cut
//! off from it may still spend (its *share* of the limit, or nothing), and how long a lease
//! of the ledger's tokens lives. Written `@home,share,ttl_ms` after the rule's other fields
//! (`@,0,2000`: the home chosen from the key, no share, leases of 2 s). The one grammar of
//! a region's name is here too: the bridge's flags and the configuration use it.

use crate::number::push_u64;

/// Longest region name.
pub const MAX_REGION_LEN: usize = 32;
/// A share is written in millionths of the limit.
pub const SHARE_SCALE: u64 = 1_000_000;
/// Shortest and longest lease of a ledger's tokens, in ms.
pub const MIN_LEASE_TTL_MS: u64 = 100;
pub const MAX_LEASE_TTL_MS: u64 = 60_000;

/// Where a region-spanning rule's budget lives, and what a region does without it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Global {
    /// The region whose Redis holds the ledger; empty: chosen from the key.
    pub home: String,
    /// Millionths of the limit (burst and rate) each region keeps for itself, which it may
    /// spend without the ledger (a partition's `share`); 0: none (`deny`).
    pub share_ppm: u64,
    /// How long a lease of the ledger's tokens lives, in ms.
    pub ttl_ms: u64,
}

/// Whether `name` is a region's name: 1 to `MAX_REGION_LEN` of lower-case letters, digits
/// and `-`, starting with a letter or digit.
pub fn valid_region(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_REGION_LEN
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// What starts a global rule's terms.
pub const GLOBAL_MARK: char = '^';

/// Appends a global rule's terms to its field (`^home,share,ttl_ms`).
pub fn encode_global(body: &mut String, global: &Global) {
    body.push(GLOBAL_MARK);
    body.push_str(&global.home);
    body.push(',');
    push_u64(body, global.share_ppm);
    body.push(',');
    push_u64(body, global.ttl_ms);
}

/// Reads the terms after a rule's `^`, strictly.
pub fn parse_global(text: &str) -> Result<Global, String> {
    let mut parts = text.split(',');
    let (Some(home), Some(share), Some(ttl), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a global rule's terms are @home,share,ttl_ms".into());
    };
    if !home.is_empty() && !valid_region(home) {
        let shown: String = home.chars().take(MAX_REGION_LEN).collect();
        return Err(format!("bad region name {shown:?}"));
    }
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let share_ppm = number(share)
        .filter(|&n| n < SHARE_SCALE)
        .ok_or("a global rule's share is 0 to 999999 millionths")?;
    let ttl_ms = number(ttl)
        .filter(|n| (MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(n))
        .ok_or_else(|| {
            format!("a global rule's lease lives {MIN_LEASE_TTL_MS} to {MAX_LEASE_TTL_MS} ms")
        })?;
    Ok(Global {
        home: home.to_string(),
        share_ppm,
        ttl_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_round_trip_and_bad_ones_are_named() {
        let global = Global {
            home: "eu-west".into(),
            share_ppm: 100_000,
            ttl_ms: 2_000,
        };
        let mut text = String::new();
        encode_global(&mut text, &global);
        assert_eq!(text, "^eu-west,100000,2000");
        assert_eq!(parse_global(&text[1..]), Ok(global));
        assert_eq!(parse_global(",0,100").unwrap().home, "");
        for bad in [
            "",
            "eu",
            "eu,0",
            "eu,0,2000,1",
            "EU,0,2000",
            "-eu,0,2000",
            "eu,1000000,2000",
            "eu,-1,2000",
            "eu,0,99",
            "eu,0,60001",
            "eu,0x1,2000",
            "eu,,2000",
        ] {
            assert!(parse_global(bad).is_err(), "{bad:?}");
        }
        let too_long = format!("{},0,2000", "a".repeat(MAX_REGION_LEN + 1));
        assert!(parse_global(&too_long).is_err(), "{too_long}");
    }

    #[test]
    fn region_names_are_short_lower_case_words() {
        for good in ["eu", "us-east-1", "0", &"a".repeat(MAX_REGION_LEN)] {
            assert!(valid_region(good), "{good}");
        }
        for bad in [
            "",
            "-eu",
            "EU",
            "eu_1",
            "eu.1",
            "eu 1",
            &"a".repeat(MAX_REGION_LEN + 1),
        ] {
            assert!(!valid_region(bad), "{bad}");
        }
    }
}
