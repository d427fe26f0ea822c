//! A worker's requests that hold in-flight slots: renewed while they live (every third of
//! their slots' life, so that a slot outlives a renewal lost or late), released when they
//! end. A request gone while its check is out is released once that check's answer comes,
//! never before it: a release that overtook its take would leave the slot held until it
//! expires. The bookkeeping only; the dispatcher sends the lines.

use crate::decision::slots::SlotLines;
use hashbrown::HashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One worker's slots held, by request.
#[derive(Debug, Default)]
pub struct Slots {
    held: HashMap<u32, SlotLines>,
    /// When each held request's next renewal is due (ms, request), soonest first: a tick
    /// looks at those due only, however many streams a worker holds. A request that ended
    /// leaves its entry here until it comes up, and is skipped then.
    due: BinaryHeap<Reverse<(u64, u32)>>,
    /// Requests gone while their check was out, until its answer.
    orphans: HashMap<u32, SlotLines>,
}

impl Slots {
    /// Request `context_id`'s check took (or may have taken) the slots of `lines`, at
    /// `now_ms`.
    pub fn hold(&mut self, context_id: u32, lines: SlotLines, now_ms: u64) {
        let at = now_ms.saturating_add(lines.renew_every_ms);
        self.held.insert(context_id, lines);
        self.due.push(Reverse((at, context_id)));
    }

    /// Request `context_id` ended: the lines of the slots it held, to release them.
    pub fn ended(&mut self, context_id: u32) -> Option<SlotLines> {
        self.held.remove(&context_id)
    }

    /// Request `context_id` ended while its check, with these slots, was out.
    pub fn orphan(&mut self, context_id: u32, lines: SlotLines) {
        self.orphans.insert(context_id, lines);
    }

    /// The check of request `context_id`, gone meanwhile, was answered (or failed): the
    /// lines of the slots it may have taken, to release them.
    pub fn answered(&mut self, context_id: u32) -> Option<SlotLines> {
        self.orphans.remove(&context_id)
    }

    /// The renewals due at `now_ms` (line, rules), each counted as renewed now.
    pub fn due(&mut self, now_ms: u64) -> Vec<(String, usize)> {
        let mut due = Vec::new();
        while let Some(&Reverse((at, context_id))) = self.due.peek() {
            if at > now_ms {
                break;
            }
            self.due.pop();
            if let Some(lines) = self.held.get(&context_id) {
                due.push((lines.renew.clone(), lines.rules));
                let next = now_ms.saturating_add(lines.renew_every_ms);
                self.due.push(Reverse((next, context_id)));
            }
        }
        due
    }

    /// Requests holding slots.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(name: &str) -> SlotLines {
        SlotLines {
            release: format!("+ {name}\n"),
            renew: format!("= {name}\n"),
            rules: 1,
            renew_every_ms: 1_000,
        }
    }

    #[test]
    fn a_held_request_is_renewed_every_period_until_it_ends() {
        let mut slots = Slots::default();
        slots.hold(7, lines("a"), 0);
        slots.hold(8, lines("b"), 500);
        assert_eq!(slots.due(999), []);
        assert_eq!(slots.due(1_000), [("= a\n".to_string(), 1)]);
        assert_eq!(slots.due(1_400), []);
        assert_eq!(slots.due(1_500), [("= b\n".to_string(), 1)]);
        assert_eq!(slots.ended(7).map(|l| l.release), Some("+ a\n".into()));
        assert_eq!(slots.ended(7), None, "released once");
        assert_eq!(slots.due(5_000), [("= b\n".to_string(), 1)]);
        assert_eq!(slots.len(), 1);
    }

    #[test]
    fn a_request_gone_mid_check_is_released_when_its_answer_comes() {
        let mut slots = Slots::default();
        slots.orphan(9, lines("c"));
        assert_eq!(slots.ended(9), None, "it held nothing yet");
        assert_eq!(slots.due(10_000), [], "nor is it renewed");
        assert_eq!(slots.answered(9).map(|l| l.release), Some("+ c\n".into()));
        assert_eq!(slots.answered(9), None);
        assert!(slots.is_empty());
    }
}
