//! One request's context: its events go to the worker's dispatcher, and it carries out
//! what the dispatcher decides for it (go on, wait, answer) and adds its response headers.

use super::abi;
use super::executor::{add_response_headers, carry_out, run};
use super::link::HostLink;
use super::proxy::{callout_reply, ProxyHost};
use crate::decision::admission::Verdict;
use crate::worker::dispatch::{Dispatcher, Go, Verdicts};
use crate::worker::stage::{Stage, Step};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::cell::RefCell;
use std::rc::Rc;

pub(super) struct Request {
    pub(super) context_id: u32,
    pub(super) dispatcher: Rc<RefCell<Dispatcher>>,
    /// The worker's wake-up queue.
    pub(super) queue: Option<u32>,
    pub(super) stage: Stage,
}

impl Context for Request {
    /// The reply to this request's own HTTP callout (no group commit).
    fn on_http_call_response(&mut self, _: u32, num_headers: usize, body_size: usize, _: usize) {
        let (status, body) = callout_reply(num_headers, body_size);
        self.run(|d, id, host, link| ((), d.own_callout_reply(id, status, &body, host, link)));
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let go = self.run(|d, id, host, link| d.request_headers(id, end_of_stream, host, link));
        self.go_on(go)
    }

    /// A body its check waits for is held back (Pause buffers it) until it has ended.
    fn on_http_request_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        let step = self.stage.request_body(end_of_stream);
        self.step(step)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let step = self.stage.request_trailers();
        self.step(step)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let header = |name: &str| abi::header_value(MapType::HttpResponseHeaders, name);
        let start = self
            .tell(|d, id, host, link| d.response_headers(id, header, host, link))
            .unwrap_or_default();
        self.stage.response_started(start.read_body);
        if let Some(reply) = start.refused {
            carry_out(&Verdict::Reply(reply));
            return Action::Pause;
        }
        if let Some(fields) = start.fields {
            add_response_headers(&fields);
        }
        Action::Continue
    }

    /// A metered response's chunks pass on at once, each read once on its way.
    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stage.response_body(end_of_stream) {
            return Action::Continue;
        }
        let chunk = abi::buffer(BufferType::HttpResponseBody, body_size).unwrap_or_default();
        self.tell(|d, id, host, link| d.response_body(id, &chunk, end_of_stream, host, link));
        Action::Continue
    }

    /// Trailers end a metered response's body as much as its last chunk would.
    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.stage.response_trailers() {
            self.tell(|d, id, host, link| d.response_body(id, &[], true, host, link));
        }
        Action::Continue
    }
}

impl Request {
    /// Runs one of this request's events on the dispatcher (`executor::run`), and the
    /// verdicts it reaches.
    fn run<T>(
        &self,
        event: impl FnOnce(&mut Dispatcher, u32, &ProxyHost, &mut HostLink) -> (T, Verdicts),
    ) -> Option<T> {
        let id = self.context_id;
        run(&self.dispatcher, self.queue, Some(id), |d, host, link| {
            event(d, id, host, link)
        })
    }

    /// Runs one of this request's events that decides nothing for any request.
    fn tell<T>(
        &self,
        event: impl FnOnce(&mut Dispatcher, u32, &ProxyHost, &mut HostLink) -> T,
    ) -> Option<T> {
        self.run(|d, id, host, link| (event(d, id, host, link), Verdicts::new()))
    }

    /// What the host does with a body chunk or trailers, as the request's stage says.
    fn step(&mut self, step: Step) -> Action {
        match step {
            Step::Pass => Action::Continue,
            Step::Hold => Action::Pause,
            Step::BodyEnded => self.body_ended(),
        }
    }

    /// The request's body has ended: the dispatcher reads it, as the host buffered it, and
    /// starts its check.
    fn body_ended(&mut self) -> Action {
        let go = self.run(|d, id, host, link| {
            abi::each_slice(BufferType::HttpRequestBody, |slice| {
                d.request_body(id, slice)
            });
            d.request_body_end(id, host, link)
        });
        self.go_on(go)
    }

    /// What the host does with the request, as the dispatcher says it goes on.
    fn go_on(&mut self, go: Option<Go>) -> Action {
        self.stage.headers_seen(go.as_ref());
        match go {
            Some(Go::Continue) | None => Action::Continue,
            Some(Go::Wait) => Action::Pause,
            // Headers paused here would hold the body back from the filter too (a host
            // delivers body chunks only past a filter that let its headers go on), so the
            // headers go on and the body is held instead: nothing the request asks for is
            // done upstream before it is checked.
            Some(Go::ReadBody) => Action::Continue,
            Some(Go::Answer(verdict)) => {
                carry_out(&verdict);
                Action::Pause
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.tell(|d, id, host, link| d.request_gone(id, host, link));
    }
}
