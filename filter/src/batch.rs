//! Coalescing: at most `max_inflight` callouts per worker; the checks that arrive while
//! that many are in flight wait (at most one tick, 1 ms) and then go to the bridge together,
//! as the lines of one callout. Fewer callouts than requests, every check still exact.

/// Longest batch one callout carries (the bridge accepts up to 1024 checks).
pub const MAX_BATCH: usize = 256;

/// One worker's callout accounting and waiting checks.
#[derive(Debug, Default)]
pub struct Batcher {
    /// 0: no limit, every check calls out at once (no coalescing).
    max_inflight: u32,
    inflight: u32,
    /// Waiting checks: the request's context id and its line of the callout body.
    queue: Vec<(u32, String)>,
}

impl Batcher {
    pub fn new(max_inflight: u32) -> Batcher {
        Batcher {
            max_inflight,
            ..Batcher::default()
        }
    }

    /// A new configuration's limit; what is in flight or waiting stays.
    pub fn set_max_inflight(&mut self, max_inflight: u32) {
        self.max_inflight = max_inflight;
    }

    /// Whether a check may call out right away; if so it counts as in flight.
    pub fn try_send(&mut self) -> bool {
        if self.max_inflight != 0 && self.inflight >= self.max_inflight {
            return false;
        }
        self.inflight += 1;
        true
    }

    /// Parks a check until the next flush.
    pub fn enqueue(&mut self, context_id: u32, line: String) {
        self.queue.push((context_id, line));
    }

    /// Forgets a waiting check whose request went away.
    pub fn remove(&mut self, context_id: u32) {
        self.queue.retain(|(id, _)| *id != context_id);
    }

    /// The next batch to send (its members, in order, and the callout body); it counts as
    /// in flight. Sent even past `max_inflight`: waiting longer would not make it cheaper.
    pub fn take_batch(&mut self) -> Option<(Vec<u32>, String)> {
        if self.queue.is_empty() {
            return None;
        }
        let n = self.queue.len().min(MAX_BATCH);
        let mut members = Vec::with_capacity(n);
        let mut body = String::new();
        for (id, line) in self.queue.drain(..n) {
            members.push(id);
            body.push_str(&line);
        }
        self.inflight += 1;
        Some((members, body))
    }

    /// A callout came back (or was abandoned).
    pub fn done(&mut self) {
        self.inflight = self.inflight.saturating_sub(1);
    }

    pub fn is_waiting(&self) -> bool {
        !self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_limit_every_check_calls_out() {
        let mut b = Batcher::new(0);
        assert!((0..1000).all(|_| b.try_send()));
    }

    #[test]
    fn past_the_limit_checks_wait_and_leave_together_in_order() {
        let mut b = Batcher::new(2);
        assert!(b.try_send() && b.try_send());
        assert!(!b.try_send());
        b.enqueue(7, "a,1,1,1,1\n".into());
        b.enqueue(9, "b,1,1,1,1\n".into());
        let (members, body) = b.take_batch().unwrap();
        assert_eq!(members, [7, 9]);
        assert_eq!(body, "a,1,1,1,1\nb,1,1,1,1\n");
        assert!(b.take_batch().is_none());
        // Three in flight now; two answers later there is room again.
        b.done();
        assert!(!b.try_send());
        b.done();
        assert!(b.try_send());
    }

    #[test]
    fn a_departed_request_leaves_the_queue() {
        let mut b = Batcher::new(1);
        b.enqueue(1, "a\n".into());
        b.enqueue(2, "b\n".into());
        b.remove(1);
        assert_eq!(b.take_batch().unwrap().0, [2]);
        assert!(!b.is_waiting());
    }

    #[test]
    fn batches_are_bounded() {
        let mut b = Batcher::new(1);
        for id in 0..(MAX_BATCH as u32 + 10) {
            b.enqueue(id, "k\n".into());
        }
        assert_eq!(b.take_batch().unwrap().0.len(), MAX_BATCH);
        assert_eq!(b.take_batch().unwrap().0.len(), 10);
    }

    #[test]
    fn done_never_underflows() {
        let mut b = Batcher::new(1);
        b.done();
        assert!(b.try_send());
        assert!(!b.try_send());
    }
}
