//! What the request's JSON body says: the reservation it asks for (an LLM request's
//! `max_tokens` or `max_completion_tokens`), and the identities read from it (its
//! `model`). The body, which the host holds back meanwhile, is read through the same
//! fixed-memory reader as a response's usage; once it has ended, a request keyed on a body
//! field is planned anew with what the body held there, and what the reserve fields hold
//! becomes the planned rules' costs. A body the upstream may read otherwise
//! (`rules::Asked::Unreadable`) reserves the rule's `max`.

use super::{Admission, Start, Worker};
use crate::decision::metered::is_identity;
use crate::host::{Kept, Proxy, RequestView};
use crate::metering::{Text, UsageReader, MAX_PATHS};
use crate::request::identity::{self, BodyRead, Problem};
use crate::request::rules::{self, Asked, PlannedRule};
use ratelimit_config::config::{Config, MAX_BODY_FIELDS};
use ratelimit_config::meter::MeterPolicy;
use ratelimit_config::source::Source;

const _: () = assert!(
    MAX_BODY_FIELDS <= MAX_PATHS,
    "a body's fields fit one reading"
);

/// The body fields a request is read for (the reserve fields of every planned rule that
/// has them, and the body identities), in one pass.
#[derive(Debug)]
pub(super) struct BodyAsk {
    /// Each field once, in the reader's order. (Past the reader's `MAX_PATHS` fields, which
    /// only many rules of different fields reach, a field is never found: its rule
    /// reserves what it would without one.)
    fields: Vec<Vec<String>>,
    /// The body identities read (indices into `Config::identities`), in the reader's order
    /// of texts; when there are any, the request is planned anew once the body has ended.
    identities: Vec<usize>,
    reader: UsageReader,
    /// The request's headers, which the host forgets once they go upstream.
    request: Kept,
    /// A rule that may apply asks a stream for its usage (`MeterPolicy::include_usage`):
    /// the texts after the identities' are `stream` and `stream_options`.
    asks_usage: bool,
}

/// What a chat completion's body is given to ask its stream for its usage.
const INCLUDE_USAGE: &[u8] = br#""stream_options":{"include_usage":true},"#;

impl BodyAsk {
    /// The reading `planned` needs, if any of its rules reserves from the body or asks a
    /// stream for its usage.
    pub(super) fn of(
        config: &Config,
        planned: &[PlannedRule],
        host: &impl Proxy,
    ) -> Option<BodyAsk> {
        let rules = planned.iter().filter_map(|p| config.rules.get(p.rule));
        let meters = rules.filter_map(|r| r.meter.as_ref());
        let reserves = meters.clone().any(|m| !m.reserve_body.is_empty());
        let asks_usage = meters.clone().any(|m| m.include_usage);
        (reserves || asks_usage).then(|| BodyAsk::reading(meters, Vec::new(), asks_usage, host))
    }

    /// The reading of a request that a rule keyed on a body field may apply to: every body
    /// identity, and every rule's reserve fields (which rules apply is known only after).
    /// A configuration reads at most `MAX_BODY_FIELDS` fields in all, so they all fit.
    pub(super) fn for_identities(config: &Config, host: &impl Proxy) -> BodyAsk {
        let texts = config.identities.iter().enumerate();
        let texts = texts.filter_map(|(index, identity)| match &identity.source {
            Source::Body(path) => Some((index, path.clone())),
            _ => None,
        });
        let meters = config.rules.iter().filter_map(|r| r.meter.as_ref());
        let asks_usage = meters.clone().any(|m| m.include_usage);
        BodyAsk::reading(meters, texts.collect(), asks_usage, host)
    }

    /// The reserve fields of `meters`, each once, the body identities `texts` (index,
    /// path), and `stream` and `stream_options` if `asks_usage`, of the request `host`
    /// sees.
    fn reading<'c>(
        meters: impl Iterator<Item = &'c MeterPolicy>,
        texts: Vec<(usize, Vec<String>)>,
        asks_usage: bool,
        host: &impl Proxy,
    ) -> BodyAsk {
        let mut fields: Vec<Vec<String>> = Vec::new();
        for field in meters.flat_map(|m| &m.reserve_body) {
            if !fields.contains(field) {
                fields.push(field.clone());
            }
        }
        let (identities, mut paths): (Vec<usize>, Vec<Vec<String>>) = texts.into_iter().unzip();
        if asks_usage {
            paths.extend([vec!["stream".into()], vec!["stream_options".into()]]);
        }
        let reader = UsageReader::of_request(fields.clone(), paths);
        BodyAsk {
            fields,
            identities,
            reader,
            request: host.keep(),
            asks_usage,
        }
    }

    /// Whether a rule that may apply asks a stream for its usage: the request's length
    /// may change, so it goes upstream without its `content-length`.
    pub(super) fn asks_usage(&self) -> bool {
        self.asks_usage
    }

    /// A streamed chat completion that does not ask for its usage is made to:
    /// `"stream_options":{"include_usage":true}` written first in its body's object. Only
    /// a plain body read whole as one JSON object (as the upstream reads it), with
    /// `"stream": true` and no `stream_options` at all: a client's own `stream_options` is
    /// its choice (`"include_usage": false` says no), and is left as it is.
    fn ask_usage(&self, host: &impl Proxy, plain: bool) {
        let reader = &self.reader;
        let at = self.identities.len();
        let whole = plain && reader.began_object() && reader.well_formed() && !reader.repeated();
        if !(whole && reader.text(at) == Text::Bool(true) && reader.text(at + 1) == Text::Absent) {
            return;
        }
        let mut body = host.request_body();
        let held = body.len();
        let Some(open) = body.iter().position(|&b| b == b'{') else {
            return;
        };
        body.splice(open + 1..open + 1, INCLUDE_USAGE.iter().copied());
        host.replace_request_body(held, &body);
    }

    /// Whether the request waits for its body to be planned.
    pub(super) fn plans(&self) -> bool {
        !self.identities.is_empty()
    }

    /// What the body held at each body identity's field, by identity index (`plain`: the
    /// body is not compressed).
    fn identity_values(
        &self,
        config: &Config,
        plain: bool,
    ) -> Vec<Result<Option<String>, Problem>> {
        let reader = &self.reader;
        let read = BodyRead::of(reader, plain);
        let mut values = vec![Ok(None); config.identities.len()];
        for (i, &id) in self.identities.iter().enumerate() {
            if let Some(value) = values.get_mut(id) {
                *value = identity::body_value(reader.text(i), read);
            }
        }
        values
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
    /// A body that may be rewritten to ask for its usage goes upstream without its length
    /// (chunked on HTTP/1.1): the same request to the upstream, whatever length it ends up.
    pub(super) fn unframe_body(&self, host: &impl Proxy) {
        if self.body.as_ref().is_some_and(BodyAsk::asks_usage) {
            host.remove_request_header("content-length");
        }
    }

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
            let req = &ask.request;
            // A compressed body cannot be read at all.
            let plain = req.header("content-encoding").is_none_or(is_identity);
            if ask.plans() {
                let values = ask.identity_values(config, plain);
                if let Some(start) = self.plan(config, worker, req, Some(&values)) {
                    return start;
                }
            }
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
                    planned.cost = rules::reservation(meter, req, asked);
                }
            }
            let meters = self
                .planned
                .iter()
                .filter_map(|p| config.rules.get(p.rule)?.meter.as_ref());
            if ask.asks_usage && meters.clone().any(|m| m.include_usage) {
                ask.ask_usage(host, plain);
            }
        }
        self.proceed(config, worker, host)
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "body_identity_tests.rs"]
mod identity_tests;

#[cfg(test)]
#[path = "include_usage_tests.rs"]
mod include_usage_tests;
