//! A reservation the request's JSON body asks for (an LLM request's `max_tokens` or
//! `max_completion_tokens`): the body, which the host holds back meanwhile, is read
//! through the same fixed-memory reader as a response's usage, and what its fields hold
//! becomes the planned rules' costs once it has ended. A body the upstream may read
//! otherwise (`rules::Asked::Unreadable`) reserves the rule's `max`.

use super::{Admission, Start, Worker};
use crate::decision::metered::is_identity;
use crate::host::Proxy;
use crate::metering::{BodyFormat, UsageReader};
use crate::request::rules::{self, Asked, PlannedRule};
use ratelimit_config::config::Config;

/// The reserve fields of every planned rule that has them, read in one pass.
#[derive(Debug)]
pub(super) struct BodyAsk {
    /// Each field once, in the reader's order. (Past the reader's `MAX_PATHS` fields, which
    /// only many rules of different fields reach, a field is never found: its rule
    /// reserves what it would without one.)
    fields: Vec<Vec<String>>,
    reader: UsageReader,
}

impl BodyAsk {
    /// The reading `planned` needs, if any of its rules reserves from the body.
    pub(super) fn of(config: &Config, planned: &[PlannedRule]) -> Option<BodyAsk> {
        let mut fields: Vec<Vec<String>> = Vec::new();
        let meters = planned
            .iter()
            .filter_map(|p| config.rules.get(p.rule)?.meter.as_ref());
        for field in meters.flat_map(|m| &m.reserve_body) {
            if !fields.contains(field) {
                fields.push(field.clone());
            }
        }
        if fields.is_empty() {
            return None;
        }
        let reader = UsageReader::new(BodyFormat::Json, fields.clone());
        Some(BodyAsk { fields, reader })
    }

    /// The largest count the body held at any of `wanted`. Unreadable unless the whole
    /// body was read as the upstream's JSON parser reads it: well formed, no key on a path
    /// twice, every field read a whole number written as one (a string, a fraction, an
    /// exponent, a negative number or one above `MAX_COUNT` may be read as a count by a
    /// lenient parser: pydantic reads `"900"`, `900.0` and `9e2` as 900).
    fn asked(&self, wanted: &[Vec<String>]) -> Asked {
        if !self.reader.trusted() {
            return Asked::Unreadable;
        }
        let values = self.reader.values();
        let at = |field: &Vec<String>| self.fields.iter().position(|f| f == field);
        let most = wanted
            .iter()
            .filter_map(|field| *values.get(at(field)?)?)
            .max();
        most.map_or(Asked::Nothing, Asked::Count)
    }
}

impl Admission {
    /// A chunk of the request's body, while it is read for what it asks to reserve.
    pub fn request_body(&mut self, chunk: &[u8]) {
        if let Some(ask) = &mut self.body {
            ask.reader.feed(chunk);
        }
    }

    /// The request's body has ended (or there was none): each rule reserving from it
    /// reserves the largest its fields or its header ask, at most its `max` (nothing
    /// readable: its `reserve`), and the check goes on.
    pub fn body_ended(&mut self, config: &Config, worker: &mut Worker, host: &impl Proxy) -> Start {
        if let Some(mut ask) = self.body.take() {
            ask.reader.finish();
            // A compressed body cannot be read at all.
            let plain = host.header("content-encoding").is_none_or(is_identity);
            for planned in &mut self.planned {
                let meter = config
                    .rules
                    .get(planned.rule)
                    .and_then(|r| r.meter.as_ref());
                if let Some(meter) = meter.filter(|m| !m.reserve_body.is_empty()) {
                    let asked = match plain {
                        true => ask.asked(&meter.reserve_body),
                        false => Asked::Unreadable,
                    };
                    planned.cost = rules::reservation(meter, host, asked);
                }
            }
        }
        self.proceed(config, worker, host)
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
