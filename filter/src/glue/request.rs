//! One request's context: its events go to the worker's dispatcher, and it carries out
//! what the dispatcher decides for it (go on, wait, answer) and adds its response headers.

use super::abi;
use super::executor::{add_response_headers, carry_out, run};
use super::link::HostLink;
use super::proxy::{callout_reply, ProxyHost};
use crate::worker::dispatch::{Dispatcher, Go, ResponseStart};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use std::cell::RefCell;
use std::rc::Rc;

pub(super) struct Request {
    pub(super) context_id: u32,
    pub(super) dispatcher: Rc<RefCell<Dispatcher>>,
    /// The worker's wake-up queue.
    pub(super) queue: Option<u32>,
    /// Its response body is being metered.
    pub(super) metered: bool,
}

impl Request {
    fn link(&self) -> HostLink {
        HostLink { queue: self.queue }
    }
}

impl Context for Request {
    /// The reply to this request's own HTTP callout (no group commit).
    fn on_http_call_response(&mut self, _: u32, num_headers: usize, body_size: usize, _: usize) {
        let (status, body) = callout_reply(num_headers, body_size);
        let (id, mut link) = (self.context_id, self.link());
        run(&self.dispatcher, None, |d| {
            let verdicts = d.own_callout_reply(id, status, &body, &ProxyHost::default(), &mut link);
            ((), verdicts)
        });
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let (id, mut link) = (self.context_id, self.link());
        let go = run(&self.dispatcher, Some(id), |d| {
            d.request_headers(id, &ProxyHost::default(), &mut link)
        });
        match go {
            Some(Go::Continue) | None => Action::Continue,
            Some(Go::Wait) => Action::Pause,
            Some(Go::Answer(verdict)) => {
                carry_out(&verdict);
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let (id, mut link, host) = (self.context_id, self.link(), ProxyHost::default());
        let header = |name: &str| abi::header_value(MapType::HttpResponseHeaders, name);
        let start = match self.dispatcher.try_borrow_mut() {
            Ok(mut d) => d.response_headers(id, header, &host, &mut link),
            Err(_) => {
                log::error!("response headers came while the dispatcher was busy");
                ResponseStart::default()
            }
        };
        self.metered = start.read_body;
        if let Some(fields) = start.fields {
            add_response_headers(&fields);
        }
        Action::Continue
    }

    /// A metered response's chunks pass on at once, each read once on its way.
    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.metered {
            return Action::Continue;
        }
        self.metered = !end_of_stream;
        let chunk = abi::buffer(BufferType::HttpResponseBody, body_size).unwrap_or_default();
        let (id, mut link, host) = (self.context_id, self.link(), ProxyHost::default());
        match self.dispatcher.try_borrow_mut() {
            Ok(mut d) => d.response_body(id, &chunk, end_of_stream, &host, &mut link),
            Err(_) => log::error!("a response's body came while the dispatcher was busy"),
        }
        Action::Continue
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let (mut link, host) = (self.link(), ProxyHost::default());
        match self.dispatcher.try_borrow_mut() {
            Ok(mut d) => d.request_gone(self.context_id, &host, &mut link),
            Err(_) => log::error!("a request ended while the dispatcher was busy"),
        }
    }
}
