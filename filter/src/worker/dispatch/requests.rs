//! The dispatcher's request events: a request's headers start its check (decided at once,
//! or held while it is out), its response headers pick up what the check adds, and its end
//! lets go of whatever is held for it.

use super::{Dispatcher, Held, Link, Phase, ResponseStart, Verdicts};
use crate::decision::admission::{decode_callout, Admission, Start, Verdict};
use crate::decision::response::{self, RateLimitFields};
use crate::host::Proxy;
use ratelimit_config::backend::Transport;

/// What a request does once its headers are seen.
#[derive(Debug, PartialEq, Eq)]
pub enum Go {
    /// Goes on now, untouched or allowed.
    Continue,
    /// Waits for its check (paused); its verdict comes with a later event.
    Wait,
    /// Answered locally now, with this reply (paused for good).
    Answer(Verdict),
    /// Waits for its body, which a rule reserves from: the headers go on, the body is
    /// held back and handed over whole when it has ended (`request_body_end`).
    ReadBody,
}

impl Go {
    /// How a request goes on with a verdict reached while its headers are seen.
    fn now(verdict: Verdict) -> Go {
        match verdict {
            Verdict::Resume => Go::Continue,
            reply => Go::Answer(reply),
        }
    }
}

impl Dispatcher {
    /// Request `context_id`'s headers (read through `host`; `end_of_stream`: it has no
    /// body): how it goes on, and verdicts reached meanwhile for other paused requests (an
    /// exchange that could not leave).
    pub fn request_headers(
        &mut self,
        context_id: u32,
        end_of_stream: bool,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> (Go, Verdicts) {
        let Some(current) = self.generations.last_mut() else {
            return (Go::Continue, Vec::new());
        };
        let mut admission = Admission::default();
        let mut start = admission.start(&current.config, &mut current.worker, host);
        let generation = current.number;
        if matches!(start, Start::ReadBody) {
            if !end_of_stream {
                self.hold(context_id, generation, admission, Phase::Reading);
                return (Go::ReadBody, Vec::new());
            }
            start = admission.body_ended(&current.config, &mut current.worker, host);
        }
        self.started(context_id, generation, admission, start, host, link)
    }

    /// A chunk of request `context_id`'s body, which its check waits for.
    pub fn request_body(&mut self, context_id: u32, chunk: &[u8]) {
        if let Some(held) = self.requests.get_mut(&context_id) {
            if held.phase == Phase::Reading {
                held.admission.request_body(chunk);
            }
        }
    }

    /// Request `context_id`'s body has ended: its check starts (under the configuration
    /// its headers saw), and it goes on as from its headers.
    pub fn request_body_end(
        &mut self,
        context_id: u32,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> (Go, Verdicts) {
        let reading = (self.requests.get(&context_id)).is_some_and(|h| h.phase == Phase::Reading);
        let Some(mut held) = reading.then(|| self.requests.remove(&context_id)).flatten() else {
            return (Go::Continue, Vec::new());
        };
        let mut all = self.generations.iter_mut();
        let Some(its) = all.find(|g| g.number == held.generation) else {
            return (Go::Continue, Vec::new()); // never: a held request keeps its generation
        };
        let start = held
            .admission
            .body_ended(&its.config, &mut its.worker, host);
        self.started(
            context_id,
            held.generation,
            held.admission,
            start,
            host,
            link,
        )
    }

    /// How request `context_id` goes on once its check has started: decided at once, or
    /// held while its check waits or is out.
    fn started(
        &mut self,
        context_id: u32,
        generation: u64,
        admission: Admission,
        start: Start,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> (Go, Verdicts) {
        let line = match start {
            Start::Skip | Start::ReadBody => return (Go::Continue, Vec::new()),
            Start::Decided(verdict) => {
                // Admitted from a lease, which may want a top-up (or, denied by another rule,
                // returned what it took from one whose owner has gone).
                let worker = self.generations.iter_mut().find(|g| g.number == generation);
                if let Some(its) = worker {
                    if super::queue_lease_lines(&mut its.worker, &mut self.exchanges) {
                        self.wake_root(link);
                    }
                }
                if let Some(outcome) = admission.outcome {
                    self.counters.add(outcome.counter(), 1);
                }
                if admission.response_headers.is_some() {
                    self.hold(context_id, generation, admission, Phase::Decided);
                }
                return (Go::now(verdict), Vec::new());
            }
            Start::Ask(line) => line,
        };
        let Some(backend) = self.generations.last().map(|g| &g.config.backend) else {
            return (Go::Continue, Vec::new());
        };
        let (transport, own_callout) = (backend.transport, backend.max_inflight == 0);
        let rules = admission.rule_count();
        self.hold(context_id, generation, admission, Phase::Parked);
        self.exchanges.enqueue(context_id, rules, line);
        // On the stream the check leaves at once if there is room, with any other waiting
        // check (the reply goes to the root whatever becomes of this request). Over HTTP
        // the root sends batches: a callout's reply goes to the context that sent it, and a
        // batch must not depend on one request living on; only without group commit is a
        // check its own callout, sent by its request. Redis calls are the root's alone too:
        // a host may cancel the calls of a request that ends.
        let verdicts = match transport {
            Transport::Grpc => self.pump(host, link),
            Transport::Http if own_callout => self.own_callout(context_id, host, link),
            Transport::Http | Transport::Redis => {
                self.wake_if_waiting(link);
                Vec::new()
            }
        };
        self.own_verdict(context_id, verdicts)
    }

    /// Sends request `context_id`'s check as its own callout (no group commit).
    fn own_callout(
        &mut self,
        context_id: u32,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let Some((id, body)) = self.take(host) else {
            return Vec::new();
        };
        match self.send(id, &body, Some(context_id), link) {
            Ok(_) => {
                if let Some(held) = self.requests.get_mut(&context_id) {
                    held.phase = Phase::Carrying(id);
                }
                Vec::new()
            }
            Err(reason) => self.fail(id, reason, host, link),
        }
    }

    /// Splits the request's own verdict from the others'.
    fn own_verdict(&mut self, context_id: u32, verdicts: Verdicts) -> (Go, Verdicts) {
        let (own, others): (Verdicts, Verdicts) =
            verdicts.into_iter().partition(|(id, _)| *id == context_id);
        let go = own
            .into_iter()
            .next()
            .map_or(Go::Wait, |(_, verdict)| Go::now(verdict));
        (go, others)
    }

    fn hold(&mut self, context_id: u32, generation: u64, admission: Admission, phase: Phase) {
        let held = Held {
            generation,
            admission,
            phase,
        };
        self.requests.insert(context_id, held);
    }

    /// The reply to request `context_id`'s own callout (status `None`: reset or timed out).
    pub fn own_callout_reply(
        &mut self,
        context_id: u32,
        status: Option<u32>,
        body: &[u8],
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let Some(held) = self.requests.get_mut(&context_id) else {
            return Vec::new();
        };
        let Phase::Carrying(id) = held.phase else {
            return Vec::new();
        };
        held.phase = Phase::Parked;
        let members = self.exchanges.complete(id).unwrap_or_default();
        let counts: Vec<usize> = members.iter().map(|m| m.rules).collect();
        let reply = decode_callout(status, body, &counts);
        self.conclude(&members, reply, host, link)
    }

    /// Request `context_id`'s response headers (`header` reads one): the rate-limit
    /// fields its check adds, once it is decided (a response that comes first, from
    /// elsewhere, gets none), and whether its body is to be metered.
    ///
    /// The headers of a request whose check waits for its body went upstream (a host
    /// hands a filter the body only after the headers have gone on), so an upstream that
    /// answers before the body is read would serve an unchecked request: an error passes
    /// (the upstream did no work), anything else is refused as unchecked.
    pub fn response_headers(
        &mut self,
        context_id: u32,
        header: impl Fn(&str) -> Option<Vec<u8>>,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> ResponseStart<RateLimitFields> {
        let Some(held) = self.requests.remove(&context_id) else {
            return ResponseStart::default();
        };
        if held.phase == Phase::Reading {
            let status = header(":status").and_then(|s| String::from_utf8(s).ok());
            let failed = status
                .and_then(|s| s.parse::<u16>().ok())
                .is_some_and(|s| s >= 400);
            let refused = (!failed).then(response::unavailable);
            return ResponseStart {
                refused,
                ..ResponseStart::default()
            };
        }
        if held.phase != Phase::Decided {
            // Still out (a response from elsewhere came first): it stays held for its answer.
            self.requests.insert(context_id, held);
            return ResponseStart::default();
        }
        let Held {
            generation,
            mut admission,
            ..
        } = held;
        let read_body = match admission.metering.take() {
            Some(metering) => {
                self.start_metering(context_id, generation, metering, header, host, link)
            }
            None => false,
        };
        ResponseStart {
            fields: admission.response_headers,
            read_body,
            refused: None,
        }
    }

    /// Request `context_id` is gone: its waiting check leaves the queue (an exchange already
    /// out keeps its line; the answer for it finds no one and is skipped), its own callout,
    /// whose reply will find no one, is done with, and a response cut short settles what it
    /// measured (an admitted request whose response never came keeps its reservation).
    pub fn request_gone(&mut self, context_id: u32, host: &impl Proxy, link: &mut impl Link) {
        self.end_metering(context_id, host, link);
        if let Some(lines) = self.slots.ended(context_id) {
            self.release_slots(lines, host, link);
        }
        let Some(held) = self.requests.remove(&context_id) else {
            return;
        };
        // Made only for a check that is out: a request decided holds its slots in `slots`.
        let lines = |d: &Self| {
            let config = d.config_of(held.generation);
            config.and_then(|c| held.admission.slot_lines(c))
        };
        match held.phase {
            Phase::Decided | Phase::Reading => {}
            Phase::Parked => {
                // Out in an exchange (not waiting in the queue): its slots go back once
                // its answer comes.
                if !self.exchanges.forget(context_id) {
                    if let Some(lines) = lines(self) {
                        self.slots.orphan(context_id, lines);
                    }
                }
            }
            Phase::Carrying(id) => {
                // Its own callout, whose answer no one will read: released now, which may
                // come before the take (the slot is then held until it expires).
                let lines = lines(self);
                self.exchanges.forget(context_id);
                self.exchanges.complete(id);
                if let Some(lines) = lines {
                    self.release_slots(lines, host, link);
                }
            }
        }
    }
}
