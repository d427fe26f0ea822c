//! What a run measured: what each exchange came back with, every latency, the status
//! codes, the errors, and the JSON summary the bench orchestration (`bench/run.py`) reads.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// What one exchange came back with.
pub struct Answer {
    /// The HTTP status (200 for an answered gRPC message).
    pub status: u16,
    /// Checks of a gRPC message the bridge answered, and those it failed or left out.
    pub checks: u64,
    pub failed_checks: u64,
    /// The first failed line of the reply, to tell why.
    pub failure: Option<String>,
    /// Data frames of the HTTP response body (0 for gRPC): on a streamed response through
    /// Envoy, about the body chunks its filters saw (see `Record::body_frames`).
    pub body_frames: u64,
}

/// The results of one worker, merged into one after the run.
#[derive(Debug, Default)]
pub struct Record {
    /// Latency of every measured request, in nanoseconds (kept whole: percentiles are
    /// computed from all of them, no histogram buckets).
    pub latencies_ns: Vec<u64>,
    /// Responses by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no response (connection refused or reset, protocol error), and
    /// gRPC exchanges with a failed check.
    pub errors: u64,
    /// gRPC mode: checks the bridge answered, and checks it failed (`!`, `?`) or left out.
    pub checks: u64,
    pub failed_checks: u64,
    /// Data frames of the measured responses' bodies. Envoy writes one HTTP/1.1 chunk per
    /// body chunk it passes its filters, and hyper's decoder never merges two chunks into
    /// one frame, so on a chunked response this is at least the chunks the filters saw: a
    /// streamed response's events Envoy read together reached the filters as one.
    pub body_frames: u64,
    /// Seconds from the start of the measured window to the first and the last send.
    pub first_send: Option<f64>,
    pub last_send: Option<f64>,
}

impl Record {
    /// Adds another worker's results to this one.
    pub fn merge(&mut self, other: Record) {
        self.latencies_ns.extend(other.latencies_ns);
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        self.errors += other.errors;
        self.checks += other.checks;
        self.failed_checks += other.failed_checks;
        self.body_frames += other.body_frames;
        self.first_send = min_opt(self.first_send, other.first_send);
        self.last_send = max_opt(self.last_send, other.last_send);
    }

    /// The summary: throughput over `elapsed`, percentiles in microseconds; with `grpc`,
    /// the checks too (`responses` and `rps` count exchanges).
    pub fn summary(mut self, elapsed: Duration, settings: Value, grpc: bool) -> Value {
        self.latencies_ns.sort_unstable();
        let responses = self.latencies_ns.len();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let us = |q: f64| percentile(&self.latencies_ns, q) as f64 / 1000.0;
        let mean = if responses == 0 {
            0.0
        } else {
            self.latencies_ns.iter().map(|&v| v as f64).sum::<f64>() / responses as f64 / 1000.0
        };
        let statuses: Map<String, Value> = self
            .statuses
            .iter()
            .map(|(s, c)| (s.to_string(), json!(c)))
            .collect();
        let window = match (self.first_send, self.last_send) {
            (Some(a), Some(b)) => b - a,
            _ => 0.0,
        };
        let mut summary = json!({
            "settings": settings,
            "elapsed_s": secs,
            "send_window_s": window,
            "responses": responses,
            "errors": self.errors,
            "rps": responses as f64 / secs,
            "status": statuses,
            "body_frames": self.body_frames,
            "latency_us": {
                "mean": mean,
                "p50": us(0.50),
                "p90": us(0.90),
                "p99": us(0.99),
                "p999": us(0.999),
                "max": us(1.0),
            },
        });
        if grpc {
            summary["grpc"] = json!({
                "checks": self.checks,
                "failed_checks": self.failed_checks,
                "checks_per_s": self.checks as f64 / secs,
            });
        }
        summary
    }
}

/// The `q`-quantile of sorted values (nearest rank), 0 when there are none.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn min_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&v, 1.0), 1000);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn merging_adds_counts_and_widens_the_window() {
        let mut a = Record {
            statuses: BTreeMap::from([(200, 2)]),
            first_send: Some(1.0),
            last_send: Some(2.0),
            ..Record::default()
        };
        a.merge(Record {
            statuses: BTreeMap::from([(200, 1), (429, 4)]),
            errors: 1,
            checks: 8,
            first_send: Some(0.5),
            last_send: Some(1.5),
            ..Record::default()
        });
        assert_eq!(a.statuses, BTreeMap::from([(200, 3), (429, 4)]));
        assert_eq!(
            (a.errors, a.checks, a.first_send, a.last_send),
            (1, 8, Some(0.5), Some(2.0))
        );
    }
}
