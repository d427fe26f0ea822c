//! The filter's counters, kept in wasm memory and handed to the host in one flush per tick:
//! a host call per request and counter would cost more than the counting is worth.

use crate::check::Outcome;

/// Every counter, exposed by Envoy as `wasmcustom.ratelimit.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Allowed,
    Denied,
    /// Requests denied from the worker's deny cache, without a check.
    DeniedCached,
    /// Requests refused because their client is blocked.
    Blocked,
    /// Requests admitted from the worker's leases, without a check.
    AllowedLeased,
    /// Requests admitted although a rule in shadow mode would have denied them.
    ShadowDenied,
    BackendFailures,
    ShortCircuits,
    /// Checks the bridge refused as malformed (they got the failure mode).
    Refused,
    /// Requests answered 400 for repeating an identity header.
    Rejected,
    /// HTTP callouts sent to the bridge.
    Callouts,
    /// Messages sent on the gRPC stream to the bridge.
    StreamMessages,
    /// Checks sent to the bridge, over all exchanges.
    ChecksSent,
    /// Exchanges by number of checks carried: 1, 2-3, 4-7, ..., 64 and more.
    Batch1,
    Batch2To3,
    Batch4To7,
    Batch8To15,
    Batch16To31,
    Batch32To63,
    Batch64Up,
}

impl Counter {
    pub const ALL: [Counter; 20] = [
        Counter::Allowed,
        Counter::Denied,
        Counter::DeniedCached,
        Counter::Blocked,
        Counter::AllowedLeased,
        Counter::ShadowDenied,
        Counter::BackendFailures,
        Counter::ShortCircuits,
        Counter::Refused,
        Counter::Rejected,
        Counter::Callouts,
        Counter::StreamMessages,
        Counter::ChecksSent,
        Counter::Batch1,
        Counter::Batch2To3,
        Counter::Batch4To7,
        Counter::Batch8To15,
        Counter::Batch16To31,
        Counter::Batch32To63,
        Counter::Batch64Up,
    ];

    /// The metric's name.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Allowed => "ratelimit.allowed",
            Counter::Denied => "ratelimit.denied",
            Counter::DeniedCached => "ratelimit.denied_cached",
            Counter::Blocked => "ratelimit.blocked",
            Counter::AllowedLeased => "ratelimit.allowed_leased",
            Counter::ShadowDenied => "ratelimit.shadow_denied",
            Counter::BackendFailures => "ratelimit.backend_failures",
            Counter::ShortCircuits => "ratelimit.short_circuits",
            Counter::Refused => "ratelimit.refused",
            Counter::Rejected => "ratelimit.rejected",
            Counter::Callouts => "ratelimit.callouts",
            Counter::StreamMessages => "ratelimit.stream_messages",
            Counter::ChecksSent => "ratelimit.checks_sent",
            Counter::Batch1 => "ratelimit.batch_1",
            Counter::Batch2To3 => "ratelimit.batch_2_3",
            Counter::Batch4To7 => "ratelimit.batch_4_7",
            Counter::Batch8To15 => "ratelimit.batch_8_15",
            Counter::Batch16To31 => "ratelimit.batch_16_31",
            Counter::Batch32To63 => "ratelimit.batch_32_63",
            Counter::Batch64Up => "ratelimit.batch_64_up",
        }
    }

    /// The counter of a check's outcome.
    pub fn of(outcome: Outcome) -> Counter {
        match outcome {
            Outcome::Allowed => Counter::Allowed,
            Outcome::Denied => Counter::Denied,
            Outcome::DeniedCached => Counter::DeniedCached,
            Outcome::Blocked => Counter::Blocked,
            Outcome::Leased => Counter::AllowedLeased,
            Outcome::ShadowDenied => Counter::ShadowDenied,
            Outcome::BackendFailed => Counter::BackendFailures,
            Outcome::ShortCircuited => Counter::ShortCircuits,
            Outcome::Refused => Counter::Refused,
            Outcome::Rejected => Counter::Rejected,
        }
    }

    /// The batch-size bucket of an exchange of `checks` checks.
    pub fn batch(checks: usize) -> Counter {
        match checks {
            0 | 1 => Counter::Batch1,
            2..=3 => Counter::Batch2To3,
            4..=7 => Counter::Batch4To7,
            8..=15 => Counter::Batch8To15,
            16..=31 => Counter::Batch16To31,
            32..=63 => Counter::Batch32To63,
            _ => Counter::Batch64Up,
        }
    }
}

/// Counts not yet handed to the host.
#[derive(Debug, Default)]
pub struct Counters {
    pending: [u64; Counter::ALL.len()],
}

impl Counters {
    pub fn add(&mut self, counter: Counter, n: u64) {
        if let Some(slot) = self.pending.get_mut(counter as usize) {
            *slot = slot.saturating_add(n);
        }
    }

    /// One exchange of `checks` checks left for the bridge.
    pub fn exchange(&mut self, http: bool, checks: usize) {
        let via = if http {
            Counter::Callouts
        } else {
            Counter::StreamMessages
        };
        self.add(via, 1);
        self.add(Counter::ChecksSent, checks as u64);
        self.add(Counter::batch(checks), 1);
    }

    /// The counts since the last drain, zero ones left out.
    pub fn drain(&mut self) -> Vec<(Counter, u64)> {
        let out = Counter::ALL
            .iter()
            .zip(self.pending.iter())
            .filter(|(_, &n)| n > 0)
            .map(|(&c, &n)| (c, n))
            .collect();
        self.pending = Default::default();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_accumulate_until_drained() {
        let mut c = Counters::default();
        c.add(Counter::Allowed, 1);
        c.add(Counter::Allowed, 2);
        c.exchange(false, 5);
        c.exchange(true, 1);
        assert_eq!(
            c.drain(),
            [
                (Counter::Allowed, 3),
                (Counter::Callouts, 1),
                (Counter::StreamMessages, 1),
                (Counter::ChecksSent, 6),
                (Counter::Batch1, 1),
                (Counter::Batch4To7, 1),
            ]
        );
        assert!(c.drain().is_empty());
    }

    #[test]
    fn batch_sizes_fall_in_power_of_two_buckets() {
        let cases = [
            (1, Counter::Batch1),
            (3, Counter::Batch2To3),
            (4, Counter::Batch4To7),
            (15, Counter::Batch8To15),
            (16, Counter::Batch16To31),
            (63, Counter::Batch32To63),
            (64, Counter::Batch64Up),
            (256, Counter::Batch64Up),
        ];
        for (n, counter) in cases {
            assert_eq!(Counter::batch(n), counter, "{n}");
        }
        let names: std::collections::HashSet<_> = Counter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), Counter::ALL.len());
        assert!(Counter::ALL
            .iter()
            .enumerate()
            .all(|(i, &c)| c as usize == i));
    }
}
