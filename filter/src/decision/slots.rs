//! An in-flight rule's slots as a worker names and sends them: each checked request gets an
//! id no other worker or gateway uses (`Ids`, which names settlements too), and a request
//! admitted with slots has two lines of its own (`SlotLines`): the lease return that releases
//! them when its stream ends, and the settlement of nothing that renews them while it lives.

use crate::request::rules::PlannedRule;
use ratelimit_config::config::Config;
use ratelimit_protocol::{encode_rule, end_check, start_lease_return, start_settlement, Settle};
use std::hash::BuildHasher;

/// Ids unique to one worker: a random prefix (the host's randomness, WASI's `random_get` in
/// the wasm build, seeds the hasher) and a counter.
#[derive(Debug)]
pub struct Ids {
    prefix: String,
    next: u32,
}

impl Default for Ids {
    fn default() -> Ids {
        let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
        Ids {
            prefix: format!("{random:016x}"),
            next: 0,
        }
    }
}

impl Ids {
    /// A fresh number and the id it is on the wire (`valid_settlement_id`).
    pub fn fresh(&mut self) -> (u32, String) {
        self.next = self.next.wrapping_add(1);
        (self.next, format!("{}-{:x}", self.prefix, self.next))
    }
}

/// The lines that release and renew one request's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLines {
    /// Gives every slot back (a lease return of each slot rule).
    pub release: String,
    /// Renews every slot (a settlement of nothing under the slots' id).
    pub renew: String,
    /// Slot rules on each line.
    pub rules: usize,
    /// How often to renew: a third of the shortest slot life among them.
    pub renew_every_ms: u64,
}

/// Gives each slot rule of `planned` one fresh id from `ids`, the request's slot id.
pub fn name_slots(planned: &mut [PlannedRule], ids: &mut Ids) {
    let mut id = None;
    for slot in planned.iter_mut().filter_map(|p| p.slot.as_mut()) {
        slot.id = id.get_or_insert_with(|| ids.fresh().1).clone();
    }
}

/// The lines of `planned`'s slots (named by `name_slots`), if it has any.
pub fn slot_lines(config: &Config, planned: &[PlannedRule]) -> Option<SlotLines> {
    let slotted: Vec<&PlannedRule> = planned.iter().filter(|p| p.slot.is_some()).collect();
    let id = &slotted.first()?.slot.as_ref()?.id;
    let mut release = String::with_capacity(80 * slotted.len());
    start_lease_return(&mut release);
    let mut renew = String::with_capacity(80 * slotted.len() + id.len());
    start_settlement(&mut renew, id);
    let nothing = Settle {
        delta: 0,
        debt: 0,
        id: id.clone(),
    };
    for (i, p) in slotted.iter().enumerate() {
        let rule = p.spec_ref(config);
        encode_rule(&mut release, i == 0, rule);
        let renewal = ratelimit_protocol::RuleSpecRef {
            cost: 0,
            settle: Some(&nothing),
            ..rule
        };
        encode_rule(&mut renew, i == 0, renewal);
    }
    end_check(&mut release);
    end_check(&mut renew);
    let shortest = slotted
        .iter()
        .filter_map(|p| p.slot.as_ref())
        .map(|s| s.ttl_ms)
        .min()?;
    Some(SlotLines {
        release,
        renew,
        rules: slotted.len(),
        renew_every_ms: shortest / 3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::planned;
    use ratelimit_protocol::slot::Slot;
    use ratelimit_protocol::{parse_batch, LineKind};

    fn config() -> Config {
        let json = r#"{"backend": {"cluster": "b"}, "rules": [
            {"name": "streams", "in_flight": {"max": 2, "ttl": "9s"}}]}"#;
        match Config::parse(json.as_bytes()) {
            Ok(config) => config,
            Err(e) => unreachable!("{e}"),
        }
    }

    #[test]
    fn a_request_s_slots_are_released_and_renewed_by_lines_the_bridge_reads() {
        let config = config();
        let slotted = |key: &str, ttl_ms| PlannedRule {
            slot: Some(Slot {
                ttl_ms,
                id: String::new(),
            }),
            ..planned(key, 2, 2, 9_000, 1)
        };
        let mut plan = [
            slotted("rl:streams:a", 9_000),
            planned("rl:rate:a", 10, 1, 600, 1),
            slotted("rl:streams", 30_000),
        ];
        let mut ids = Ids::default();
        name_slots(&mut plan, &mut ids);
        let id = plan[0].slot.as_ref().map(|s| s.id.clone());
        assert_eq!(id, plan[2].slot.as_ref().map(|s| s.id.clone()));
        assert_eq!(ids.fresh().0, 2, "one id for the request");
        let Some(lines) = slot_lines(&config, &plan) else {
            unreachable!("two slot rules")
        };
        assert_eq!((lines.rules, lines.renew_every_ms), (2, 3_000));
        let body = format!("{}{}", lines.release, lines.renew);
        let Ok(parsed) = parse_batch(body.as_bytes()) else {
            unreachable!("{body}")
        };
        let kinds: Vec<(LineKind, Vec<String>)> = parsed
            .into_iter()
            .map(|line| match line {
                Ok(line) => (line.kind, line.rules.into_iter().map(|r| r.key).collect()),
                Err(e) => unreachable!("{e}: {body}"),
            })
            .collect();
        let keys = vec!["rl:streams:a".to_string(), "rl:streams".to_string()];
        assert_eq!(
            kinds,
            [
                (LineKind::LeaseReturn, keys.clone()),
                (LineKind::Settlement, keys)
            ]
        );
        let mut none = [planned("rl:rate:a", 10, 1, 600, 1)];
        name_slots(&mut none, &mut ids);
        assert_eq!(ids.fresh().0, 3, "no id drawn for a request without slots");
        assert_eq!(slot_lines(&config, &none), None);
    }

    #[test]
    fn workers_name_their_requests_apart() {
        let (mut one, mut two) = (Ids::default(), Ids::default());
        let (a, b) = (one.fresh().1, two.fresh().1);
        assert_ne!(a, b);
        assert!(ratelimit_protocol::valid_settlement_id(&a));
        assert_ne!(one.fresh().1, a);
    }
}
