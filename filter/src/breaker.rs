//! A circuit breaker per worker: after a run of backend failures the filter stops calling
//! out for a growing interval and applies the failure mode at once, so a dead backend adds
//! no latency; one probe at a time tests whether it is back.

use serde::Deserialize;

/// When to open and for how long.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker; 0 turns it off.
    pub failures: u32,
    /// First open interval; each failed probe doubles it.
    pub open_ms: u64,
    /// Ceiling of the doubling.
    pub max_open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            open_ms: 1_000,
            max_open_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calling out; `failures` consecutive ones so far.
    Closed { failures: u32 },
    /// Not calling out until `until_ms`; `interval_ms` is how long this opening lasts.
    Open { until_ms: u64, interval_ms: u64 },
    /// One probe in flight since `since_ms`; the others short-circuit meanwhile.
    Probing { since_ms: u64, interval_ms: u64 },
}

/// The breaker of one worker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    /// A probe whose request vanished (stream reset) is given up after this long.
    probe_timeout_ms: u64,
    state: State,
}

impl Breaker {
    pub fn new(config: BreakerConfig, callout_timeout_ms: u64) -> Breaker {
        Breaker {
            config,
            probe_timeout_ms: callout_timeout_ms.saturating_mul(2).max(1),
            state: State::Closed { failures: 0 },
        }
    }

    /// Whether this request may call out now.
    pub fn allow(&mut self, now_ms: u64) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open {
                until_ms,
                interval_ms,
            } if now_ms >= until_ms => {
                self.state = State::Probing {
                    since_ms: now_ms,
                    interval_ms,
                };
                true
            }
            State::Probing {
                since_ms,
                interval_ms,
            } if now_ms.saturating_sub(since_ms) >= self.probe_timeout_ms => {
                self.state = State::Probing {
                    since_ms: now_ms,
                    interval_ms,
                };
                true
            }
            State::Open { .. } | State::Probing { .. } => false,
        }
    }

    pub fn record_success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    pub fn record_failure(&mut self, now_ms: u64) {
        if self.config.failures == 0 {
            return;
        }
        self.state = match self.state {
            State::Closed { failures } if failures + 1 < self.config.failures => State::Closed {
                failures: failures + 1,
            },
            State::Closed { .. } => State::Open {
                until_ms: now_ms.saturating_add(self.config.open_ms),
                interval_ms: self.config.open_ms,
            },
            State::Probing { interval_ms, .. } | State::Open { interval_ms, .. } => {
                let interval_ms = interval_ms.saturating_mul(2).min(self.config.max_open_ms);
                State::Open {
                    until_ms: now_ms.saturating_add(interval_ms),
                    interval_ms,
                }
            }
        };
    }

    /// Whether the breaker is keeping requests from calling out.
    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(
            BreakerConfig {
                failures: 3,
                open_ms: 100,
                max_open_ms: 350,
            },
            25,
        )
    }

    #[test]
    fn opens_after_the_configured_run_of_failures() {
        let mut b = breaker();
        for _ in 0..2 {
            assert!(b.allow(0));
            b.record_failure(0);
        }
        assert!(!b.is_open());
        b.record_failure(0);
        assert!(b.is_open());
        assert!(!b.allow(50));
    }

    #[test]
    fn a_success_resets_the_run() {
        let mut b = breaker();
        b.record_failure(0);
        b.record_failure(0);
        b.record_success();
        b.record_failure(0);
        b.record_failure(0);
        assert!(!b.is_open());
    }

    #[test]
    fn one_probe_at_a_time_then_close_on_success() {
        let mut b = breaker();
        (0..3).for_each(|_| b.record_failure(0));
        assert!(b.allow(100), "the first request after the interval probes");
        assert!(!b.allow(101), "others short-circuit while it is in flight");
        b.record_success();
        assert!(!b.is_open());
        assert!(b.allow(102));
    }

    #[test]
    fn failed_probes_double_the_interval_up_to_the_ceiling() {
        let mut b = breaker();
        (0..3).for_each(|_| b.record_failure(0));
        let mut now = 0;
        for interval in [200, 350, 350] {
            now += if now == 0 { 100 } else { 0 };
            assert!(b.allow(now));
            b.record_failure(now);
            assert!(
                !b.allow(now + interval - 1),
                "still open just before {interval} ms"
            );
            now += interval;
        }
        assert!(b.allow(now));
    }

    #[test]
    fn a_vanished_probe_does_not_wedge_the_breaker() {
        let mut b = breaker();
        (0..3).for_each(|_| b.record_failure(0));
        assert!(b.allow(100));
        assert!(!b.allow(120));
        assert!(
            b.allow(150),
            "probe given up after twice the callout timeout"
        );
    }

    #[test]
    fn zero_failures_turns_it_off() {
        let mut b = Breaker::new(
            BreakerConfig {
                failures: 0,
                ..BreakerConfig::default()
            },
            25,
        );
        (0..100).for_each(|_| b.record_failure(0));
        assert!(b.allow(0));
    }
}
