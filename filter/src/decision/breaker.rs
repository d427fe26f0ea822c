//! A circuit breaker per worker: after a run of backend failures the filter stops calling
//! out for a growing interval and applies the failure mode at once, so a dead backend adds
//! no latency; one probe at a time tests whether it is back. When it opens and for how long
//! is the configuration's `circuit_breaker` (`ratelimit_config::options::BreakerConfig`).

use ratelimit_config::options::BreakerConfig;

/// What `allow` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call out as usual.
    Call,
    /// Call out: this request tests whether the backend is back.
    Probe,
    /// Don't call out: apply the failure mode now.
    Deny,
}

/// What a failure did to the breaker, so the caller logs transitions, not every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The first failure after a success.
    FirstOfRun,
    /// Another failure of a run.
    Counted,
    /// The breaker opened for this many milliseconds.
    Opened(u64),
    /// A late failure while open: no change.
    Ignored,
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

    /// Whether this request may call out now, and whether it is the probe.
    pub fn allow(&mut self, now_ms: u64) -> Permit {
        match self.state {
            State::Closed { .. } => Permit::Call,
            State::Open {
                until_ms,
                interval_ms,
            } if now_ms >= until_ms => {
                self.state = State::Probing {
                    since_ms: now_ms,
                    interval_ms,
                };
                Permit::Probe
            }
            // The probe's request vanished (stream reset): send another.
            State::Probing {
                since_ms,
                interval_ms,
            } if now_ms.saturating_sub(since_ms) >= self.probe_timeout_ms => {
                self.state = State::Probing {
                    since_ms: now_ms,
                    interval_ms,
                };
                Permit::Probe
            }
            State::Open { .. } | State::Probing { .. } => Permit::Deny,
        }
    }

    /// A callout was answered: the backend works. Returns whether the breaker was open.
    pub fn record_success(&mut self) -> bool {
        let was_open = self.is_open();
        self.state = State::Closed { failures: 0 };
        was_open
    }

    /// A callout failed. Only failures of calls made while closed, and of the probe, count:
    /// the late failures of calls sent before the breaker opened say nothing new.
    pub fn record_failure(&mut self, now_ms: u64, was_probe: bool) -> Failure {
        let (state, failure) = match self.state {
            // Turned off: never opens, but still tells the first failure of a run apart,
            // so an outage is logged as loudly as with the breaker on.
            State::Closed { failures } if self.config.failures == 0 => (
                State::Closed {
                    failures: failures.saturating_add(1),
                },
                if failures == 0 {
                    Failure::FirstOfRun
                } else {
                    Failure::Counted
                },
            ),
            State::Closed { failures } if failures + 1 < self.config.failures => (
                State::Closed {
                    failures: failures + 1,
                },
                if failures == 0 {
                    Failure::FirstOfRun
                } else {
                    Failure::Counted
                },
            ),
            State::Closed { .. } => (
                self.open(now_ms, self.config.open_ms),
                Failure::Opened(self.config.open_ms),
            ),
            State::Probing { interval_ms, .. } if was_probe => {
                let ceiling = self.config.max_open_ms.unwrap_or(self.config.open_ms);
                let interval_ms = interval_ms.saturating_mul(2).min(ceiling);
                (self.open(now_ms, interval_ms), Failure::Opened(interval_ms))
            }
            state @ (State::Open { .. } | State::Probing { .. }) => (state, Failure::Ignored),
        };
        self.state = state;
        failure
    }

    fn open(&self, now_ms: u64, interval_ms: u64) -> State {
        State::Open {
            until_ms: now_ms.saturating_add(interval_ms),
            interval_ms,
        }
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
                max_open_ms: Some(350),
            },
            25,
        )
    }

    fn open(b: &mut Breaker) {
        for _ in 0..3 {
            b.record_failure(0, false);
        }
        assert!(b.is_open());
    }

    #[test]
    fn opens_after_the_configured_run_of_failures() {
        let mut b = breaker();
        assert_eq!(b.record_failure(0, false), Failure::FirstOfRun);
        assert_eq!(b.record_failure(0, false), Failure::Counted);
        assert!(!b.is_open());
        assert_eq!(b.record_failure(0, false), Failure::Opened(100));
        assert_eq!(b.allow(50), Permit::Deny);
    }

    #[test]
    fn a_success_resets_the_run() {
        let mut b = breaker();
        b.record_failure(0, false);
        b.record_failure(0, false);
        assert!(!b.record_success());
        b.record_failure(0, false);
        b.record_failure(0, false);
        assert!(!b.is_open());
    }

    #[test]
    fn one_probe_at_a_time_then_close_on_success() {
        let mut b = breaker();
        open(&mut b);
        assert_eq!(
            b.allow(100),
            Permit::Probe,
            "the first request after the interval"
        );
        assert_eq!(
            b.allow(101),
            Permit::Deny,
            "others wait while it is in flight"
        );
        assert!(b.record_success(), "it was open");
        assert_eq!(b.allow(102), Permit::Call);
    }

    #[test]
    fn late_failures_of_earlier_calls_do_not_extend_the_interval() {
        let mut b = breaker();
        open(&mut b);
        for _ in 0..50 {
            assert_eq!(b.record_failure(10, false), Failure::Ignored);
        }
        assert_eq!(b.allow(100), Permit::Probe, "still the first interval");
        assert_eq!(
            b.record_failure(101, false),
            Failure::Ignored,
            "not the probe"
        );
        assert_eq!(b.allow(102), Permit::Deny, "the probe is still in flight");
    }

    #[test]
    fn failed_probes_double_the_interval_up_to_the_ceiling() {
        let mut b = breaker();
        open(&mut b);
        let mut now = 100;
        for interval in [200, 350, 350] {
            assert_eq!(b.allow(now), Permit::Probe);
            assert_eq!(b.record_failure(now, true), Failure::Opened(interval));
            assert_eq!(
                b.allow(now + interval - 1),
                Permit::Deny,
                "open just before {interval} ms"
            );
            now += interval;
        }
        assert_eq!(b.allow(now), Permit::Probe);
    }

    #[test]
    fn by_default_a_worker_probes_every_open_interval_however_long_the_outage() {
        let mut b = Breaker::new(BreakerConfig::default(), 25);
        for _ in 0..5 {
            b.record_failure(0, false);
        }
        let mut now = 0;
        for _ in 0..40 {
            now += 1_000;
            assert_eq!(b.allow(now), Permit::Probe, "a probe a second at {now} ms");
            assert_eq!(b.record_failure(now, true), Failure::Opened(1_000));
        }
    }

    #[test]
    fn a_vanished_probe_does_not_wedge_the_breaker() {
        let mut b = breaker();
        open(&mut b);
        assert_eq!(b.allow(100), Permit::Probe);
        assert_eq!(b.allow(120), Permit::Deny);
        assert_eq!(
            b.allow(150),
            Permit::Probe,
            "given up after twice the callout timeout"
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
        // The first failure of each run is still told apart, for the warning in the log.
        assert_eq!(b.record_failure(0, false), Failure::FirstOfRun);
        (0..100).for_each(|_| {
            assert_eq!(b.record_failure(0, false), Failure::Counted);
        });
        assert_eq!(b.allow(0), Permit::Call);
        b.record_success();
        assert_eq!(b.record_failure(0, false), Failure::FirstOfRun);
    }
}
