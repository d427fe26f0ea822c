//! The host as the filter's logic sees it (request, clock, shared data), the counters it
//! exposes, and the host calls that carry out a verdict. Every host error is handled here.

use super::abi;
use crate::check::{Outcome, Verdict};
use crate::counters::{self, Counter, Counters, RuleCounts, PER_RULE};
use crate::header_map::HeaderMap;
use crate::host::{Proxy, RequestView, SharedData, Sole};
use crate::protocol;
use proxy_wasm::types::BufferType;
use ratelimit_config::config::Config;
use std::cell::{OnceCell, RefCell};

/// The current (effective) context's request, the clock and shared data.
#[derive(Default)]
pub struct ProxyHost {
    /// The request's headers, fetched in one host call the first time one is read.
    headers: OnceCell<HeaderMap>,
}

impl ProxyHost {
    fn headers(&self) -> &HeaderMap {
        self.headers.get_or_init(abi::request_headers)
    }
}

impl RequestView for ProxyHost {
    fn header(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes();
        self.headers()
            .pairs()
            .find_map(|(key, value)| (key == name).then_some(value))
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        let mut values = self.headers().values(name);
        match (values.next(), values.next()) {
            (None, _) => Sole::Absent,
            (Some(value), None) => Sole::Once(value),
            (Some(_), Some(_)) => Sole::Repeated,
        }
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.headers().values(name).collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        abi::property(&["source", "address"])
    }

    /// `xds.route_name` in stock Envoy (1.40 has no `route_name`); `route_name`, what
    /// Higress's plugins read, where a host lacks the former. One host call on Envoy.
    fn route_name(&self) -> Option<Vec<u8>> {
        abi::property(&["xds", "route_name"]).or_else(|| abi::property(&["route_name"]))
    }
}

impl SharedData for ProxyHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        abi::shared_data(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        abi::set_shared_data(key, value, cas).is_ok()
    }
}

impl Proxy for ProxyHost {
    fn now_ms(&self) -> u64 {
        abi::now_ms()
    }
}

/// The reply to the callout being answered: HTTP status (`None` for a reset or a timeout
/// without one) and body, bounded.
pub fn callout_reply(num_headers: usize, body_size: usize) -> (Option<u32>, Vec<u8>) {
    // A reset callout comes back with no headers, and then Envoy has no reply map at
    // all: reading it answers BadArgument, on which the SDK panics. Don't ask.
    let status = (num_headers > 0)
        .then(|| abi::callout_reply_header(":status"))
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok());
    let size = body_size.min(protocol::MAX_REPLY_LEN + 1);
    let body = (size > 0)
        .then(|| abi::buffer(BufferType::HttpCallResponseBody, size))
        .flatten()
        .unwrap_or_default();
    (status, body)
}

/// Carries out a verdict on the current (effective) request, which is paused.
pub fn carry_out(verdict: &Verdict) {
    match verdict {
        Verdict::Resume => {
            if let Err(e) = abi::resume_request() {
                log::warn!("resume failed: {e:?}");
            }
        }
        Verdict::Reply(reply) => {
            let body = reply.body.as_bytes();
            if let Err(e) = abi::send_local_reply(reply.status, &reply.headers, body) {
                log::warn!("local reply failed: {e:?}");
            }
        }
    }
}

/// The counters' host metric ids and the counts not yet flushed to them.
pub struct Metrics {
    ids: Vec<(Counter, Option<u32>)>,
    pub counts: RefCell<Counters>,
}

impl Metrics {
    pub fn define() -> Metrics {
        let ids = Counter::ALL
            .iter()
            .map(|&c| (c, abi::define_counter(c.name())))
            .collect();
        Metrics {
            ids,
            counts: RefCell::default(),
        }
    }

    pub fn count(&self, outcome: Option<Outcome>) {
        if let (Some(outcome), Ok(mut counts)) = (outcome, self.counts.try_borrow_mut()) {
            counts.add(outcome.counter(), 1);
        }
    }

    pub fn exchange(&self, http: bool, checks: usize) {
        if let Ok(mut counts) = self.counts.try_borrow_mut() {
            counts.exchange(http, checks);
        }
    }

    /// Hands the counts to the host.
    pub fn flush(&self) {
        let Ok(drained) = self.counts.try_borrow_mut().map(|mut c| c.drain()) else {
            return;
        };
        for (counter, n) in drained {
            let id = self
                .ids
                .iter()
                .find(|(c, _)| *c == counter)
                .and_then(|(_, id)| *id);
            if let (Some(id), Ok(n)) = (id, i64::try_from(n)) {
                let _ = abi::increment_metric(id, n);
            }
        }
    }
}

/// The host metric ids of the per-rule counters (`PER_RULE`) of one configuration's rules.
pub struct RuleMetrics {
    ids: Vec<[Option<u32>; PER_RULE.len()]>,
}

impl RuleMetrics {
    /// Defines them (the host hands back the existing metric for a name it knows).
    pub fn define(config: &Config) -> RuleMetrics {
        let ids = config
            .rules
            .iter()
            .map(|rule| {
                PER_RULE.map(|counter| {
                    let name = counters::per_rule_name(counter, &rule.name);
                    abi::define_counter(&name)
                })
            })
            .collect();
        RuleMetrics { ids }
    }

    pub fn flush(&self, counts: &mut RuleCounts) {
        for (rule, counter, n) in counts.drain() {
            let slot = PER_RULE.iter().position(|&c| c == counter);
            let id = slot.and_then(|s| *self.ids.get(rule)?.get(s)?);
            if let (Some(id), Ok(n)) = (id, i64::try_from(n)) {
                let _ = abi::increment_metric(id, n);
            }
        }
    }
}
