//! The ledger of a global rule's key, in its home region's Redis (`lua/ledger.lua`): the
//! calls a bridge makes to it (a grant, a return, a read), and the part of the rule's limit
//! it keeps, the rest being the regions' own shares (`Split`).
//!
//! The split is exact or errs on the side of less: the ledger's capacity and rate and every
//! region's share, each rounded down, never add up to more than the rule's limit, so the
//! bound of docs/regions.md holds with them.

use crate::store::check::RuleSpec;
use crate::store::Store;
use ratelimit_protocol::gcd;
use ratelimit_protocol::global::SHARE_SCALE;
use ratelimit_protocol::MAX_EXACT;

/// The script that keeps ledgers.
pub const LEDGER_LUA: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/ledger.lua"));

/// A token bucket's numbers: `capacity` tokens, `num` units a ms, `den` units a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub capacity: u64,
    pub num: u64,
    pub den: u64,
}

/// A global rule's limit divided between the ledger (what it leases to every region) and
/// each region's own share (what a region may spend without the ledger, `share` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub ledger: Shape,
    pub share: Option<Shape>,
}

/// `num / den` tokens a ms, times `part / SHARE_SCALE`, reduced, as a shape of `capacity`
/// tokens kept exact (`capacity x den` below 2^53): the rate rounded down where it must be.
fn scaled(capacity: u64, num: u64, den: u64, part: u64) -> Result<Shape, String> {
    let mut n = u128::from(num) * u128::from(part);
    let mut d = u128::from(den) * u128::from(SHARE_SCALE);
    let g = u128::from(gcd(
        u64::try_from(n).unwrap_or(u64::MAX),
        u64::try_from(d).unwrap_or(u64::MAX),
    ))
    .max(1);
    if n % g == 0 && d % g == 0 {
        (n, d) = (n / g, d / g);
    }
    let exact = u128::from(MAX_EXACT);
    let over = (u128::from(capacity.max(1)) * d).div_ceil(exact - 1);
    if over > 1 {
        n /= over;
        d /= over;
    }
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(num), Ok(den))
            if num >= 1 && den >= 1 && u128::from(capacity) * u128::from(den) < exact =>
        {
            Ok(Shape { capacity, num, den })
        }
        _ => Err("the limit is too fine to divide between the regions exactly".into()),
    }
}

/// How `rule`'s limit divides over `regions` regions with each keeping `share_ppm`
/// millionths of it.
pub fn split(rule: &RuleSpec, share_ppm: u64, regions: u64) -> Result<Split, String> {
    let shares = share_ppm.saturating_mul(regions);
    if shares >= SHARE_SCALE {
        return Err(format!(
            "a share of {share_ppm} millionths in each of {regions} regions leaves the ledger \
             nothing"
        ));
    }
    let part = |ppm: u64| {
        let capacity = u128::from(rule.burst) * u128::from(ppm) / u128::from(SHARE_SCALE);
        u64::try_from(capacity).unwrap_or(u64::MAX)
    };
    let rest = SHARE_SCALE - shares;
    let ledger = scaled(part(rest), rule.num, rule.den, rest)?;
    let share = match share_ppm {
        0 => None,
        ppm => Some(scaled(part(ppm), rule.num, rule.den, ppm)?),
    };
    Ok(Split { ledger, share })
}

/// The key a ledger is kept under, beside nothing a gateway can name (`{` is in no key of
/// the grammar) and in the bucket key's own hash slot.
pub fn ledger_key(key: &str) -> String {
    format!("{key}{{{key}}}#ledger")
}

/// The epoch key of `key`'s hash slot (`lua/ledger.lua`): what a ledger found missing
/// learns from on a server that may have lost it, one for every ledger of the slot (per
/// key, it would be lost with the ledger). In the slot for a Cluster's script, named by no
/// key of the grammar (`{`).
pub fn epoch_key(key: &str) -> String {
    let slot = usize::from(crate::store::slot::slot(ledger_key(key).as_bytes()));
    match slot_tags().get(slot) {
        Some(&tag) if tag != u32::MAX => format!("rl#ledger-epoch{{{tag}}}"),
        // No number found for the slot (there is one for each below 200,000): the key's
        // own epoch, which learns more often, never less.
        _ => format!("{key}{{{key}}}#ledger-epoch"),
    }
}

/// For each slot, the first number whose digits hash to it.
fn slot_tags() -> &'static [u32] {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; usize::from(crate::store::slot::SLOTS)];
        let mut left = tags.len();
        for n in 0..1_000_000u32 {
            let at = usize::from(crate::store::slot::slot(n.to_string().as_bytes()));
            if let Some(tag @ &mut u32::MAX) = tags.get_mut(at) {
                *tag = n;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        tags
    })
}

/// What a ledger call says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The home server's clock.
    pub now_ms: u64,
    /// Tokens granted, or taken back.
    pub tokens: u64,
    /// When a grant ends by the home server's clock.
    pub expires_ms: u64,
    /// Whole tokens the ledger holds, and has out on leases.
    pub level: u64,
    pub outstanding: u64,
    /// Until when it grants nothing, having possibly missed writes (0: it grants).
    pub learning_until_ms: u64,
    /// Until one token is there (or learning ends).
    pub wait_ms: u64,
    /// Leases out.
    pub leases: u64,
}

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `tokens` for a lease of `ttl_ms` (the same `seq` again: the same grant).
    Grant,
    /// `tokens` unspent of lease `seq`, which its holder no longer spends.
    Return,
    /// Nothing: the ledger as it stands.
    Read,
}

/// One call of the ledger of `key` (under `split.ledger`) on `home`, by `holder`.
#[allow(clippy::too_many_arguments)]
pub async fn call(
    home: &Store,
    key: &str,
    mode: Mode,
    holder: &str,
    seq: u64,
    tokens: u64,
    ttl_ms: u64,
    shape: Shape,
) -> Result<Reply, String> {
    let script = redis::Script::new(LEDGER_LUA);
    let mode = match mode {
        Mode::Grant => "grant",
        Mode::Return => "return",
        Mode::Read => "read",
    };
    let numbers =
        [seq, tokens, ttl_ms, shape.capacity, shape.num, shape.den].map(|n| n.to_string());
    let mut args = vec![mode, holder];
    args.extend(numbers.iter().map(String::as_str));
    let keys = [ledger_key(key), epoch_key(key)];
    let reply: Vec<i64> = (home.eval(&script, &[&keys[0], &keys[1]], &args)).await?;
    let n = |i: usize| reply.get(i).map_or(0, |&v| u64::try_from(v).unwrap_or(0));
    if reply.len() != 8 {
        return Err(format!("ledger: a reply of {} numbers, not 8", reply.len()));
    }
    Ok(Reply {
        now_ms: n(0),
        tokens: n(1),
        expires_ms: n(2),
        level: n(3),
        outstanding: n(4),
        learning_until_ms: n(5),
        wait_ms: n(6),
        leases: n(7),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(burst: u64, num: u64, den: u64) -> RuleSpec {
        RuleSpec::plain("rl:g:k", burst, num, den, 1)
    }

    #[test]
    fn a_limit_divides_between_the_ledger_and_the_shares_never_into_more() {
        // 1000 an hour: 1 unit a ms, 3,600 units a token.
        let whole = split(&rule(1000, 1, 3_600), 0, 3).unwrap();
        assert_eq!(
            whole.ledger,
            Shape {
                capacity: 1000,
                num: 1,
                den: 3_600
            }
        );
        assert_eq!(whole.share, None);
        let shared = split(&rule(1000, 1, 3_600), 100_000, 3).unwrap();
        assert_eq!(
            shared.ledger,
            Shape {
                capacity: 700,
                num: 7,
                den: 36_000
            }
        );
        assert_eq!(
            shared.share,
            Some(Shape {
                capacity: 100,
                num: 1,
                den: 36_000
            })
        );
        // 10 a second (1 token 100 units, reduced) with a third each: rounded down.
        let thirds = split(&rule(10, 1, 100), 333_333, 2).unwrap();
        let total_capacity = thirds.ledger.capacity + 2 * thirds.share.unwrap().capacity;
        assert!(total_capacity <= 10, "{thirds:?}");
        let rate = |s: Shape| s.num as f64 / s.den as f64;
        assert!(rate(thirds.ledger) + 2.0 * rate(thirds.share.unwrap()) <= 0.01 + 1e-12);
        assert!(
            split(&rule(1000, 1, 3_600), 500_000, 2).is_err(),
            "nothing left"
        );
    }

    #[test]
    fn a_ledgers_key_is_none_a_gateway_can_name_and_shares_the_buckets_slot() {
        let key = ledger_key("rl:g:alice");
        assert_eq!(key, "rl:g:alice{rl:g:alice}#ledger");
        assert!(ratelimit_protocol::key::parse_key(&key).is_err());
        assert_eq!(
            crate::store::slot::slot(key.as_bytes()),
            crate::store::slot::slot(b"rl:g:alice")
        );
    }

    #[test]
    fn every_slot_has_an_epoch_in_it_which_no_gateway_can_name() {
        assert!(slot_tags().iter().all(|&tag| tag != u32::MAX));
        for key in ["rl:g:alice", "rl:g:bob", "rl:tenant:tenant-1"] {
            let epoch = epoch_key(key);
            assert!(epoch.starts_with("rl#ledger-epoch{"), "{epoch}");
            assert_eq!(
                crate::store::slot::slot(epoch.as_bytes()),
                crate::store::slot::slot(ledger_key(key).as_bytes())
            );
            assert!(ratelimit_protocol::key::parse_key(&epoch).is_err());
        }
    }
}
