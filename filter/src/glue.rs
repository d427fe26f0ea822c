//! The proxy-wasm binding: a root context that owns the validated configuration and an
//! HTTP context per request that pauses on the bridge callout and resumes or replies.
//!
//! Host calls go through `proxy_wasm::hostcalls` so that every host error is handled here
//! instead of unwrapped: a panic would kill the VM and every request of its worker.

use crate::check::{Check, Verdict};
use crate::config::Config;
use crate::identity::RequestView;
use crate::protocol;
use crate::response::LocalReply;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { config: None }) });
}}

struct Root {
    /// `None` until a configuration has been accepted; replaced whole on reconfiguration.
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match Config::parse(&bytes) {
            Ok(config) => {
                log::info!("configured {} rule(s)", config.rules.len());
                self.config = Some(Rc::new(config));
                true
            }
            Err(e) => {
                log::error!("invalid plugin configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(Request {
            config,
            check: Check::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    config: Rc<Config>,
    check: Check,
}

/// The current request as the host sees it.
struct Host;

impl RequestView for Host {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        hostcalls::get_property(vec!["source", "address"])
            .ok()
            .flatten()
    }
}

impl Request {
    fn apply(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Resume => {
                if let Err(e) = hostcalls::resume_http_request() {
                    log::warn!("resume failed: {e:?}");
                }
            }
            Verdict::Reply(reply) => send(&reply),
        }
    }
}

fn send(reply: &LocalReply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    if let Err(e) =
        hostcalls::send_http_response(reply.status, headers, Some(reply.body.as_bytes()))
    {
        log::warn!("local reply failed: {e:?}");
    }
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let status = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse().ok());
        let size = body_size.min(protocol::MAX_REPLY_LEN + 1);
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let verdict = self.check.finish(&self.config, status, &body);
        self.apply(verdict);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(body) = self.check.start(&self.config, &Host) else {
            return Action::Continue;
        };
        let backend = &self.config.backend;
        let headers = vec![
            (":method", "POST"),
            (":path", protocol::PATH),
            (":authority", backend.authority.as_str()),
            ("content-type", "text/plain"),
        ];
        let timeout = Duration::from_millis(backend.timeout_ms);
        match hostcalls::dispatch_http_call(
            &backend.cluster,
            headers,
            Some(body.as_bytes()),
            vec![],
            timeout,
        ) {
            Ok(_) => Action::Pause,
            Err(e) => match self
                .check
                .fail(&self.config, &format!("dispatch failed: {e:?}"))
            {
                Verdict::Resume => Action::Continue,
                Verdict::Reply(reply) => {
                    send(&reply);
                    Action::Pause
                }
            },
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in &self.check.response_headers {
            if let Err(e) = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value) {
                log::warn!("adding {name} failed: {e:?}");
            }
        }
        Action::Continue
    }
}
