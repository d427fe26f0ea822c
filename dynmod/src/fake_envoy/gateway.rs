//! The fake's driver: a `Gateway` makes a configuration of the module and requests on it,
//! runs the main thread's and the worker's scheduled events when the test says, and plays
//! the bridge on each worker's stream.

use super::{envoy, lent, misused, Config, Filter};
use crate::abi::EnvoyHeader;
use crate::config_hooks;
use crate::hooks;
use ratelimit_protocol::{
    parse_batch, prefixed, render_reply, split_message, stream_message, CheckResult, RuleResult,
};
use std::ffi::c_void;

/// One gateway: a configuration of the module, its requests on the calling thread.
pub struct Gateway {
    envoy: usize,
    module: usize,
}

impl Gateway {
    /// The module's configuration of `json`, or `None` where the module refuses it.
    pub fn new(json: &str) -> Option<Gateway> {
        let envoy = {
            let mut state = envoy();
            let id = state.next_id() as usize;
            state.configs.insert(id, Config::default());
            id
        };
        let module = config_hooks::envoy_dynamic_module_on_http_filter_config_new(
            envoy as *mut c_void,
            lent(b"ratelimit"),
            lent(json.as_bytes()),
        );
        (!module.is_null()).then(|| Gateway {
            envoy,
            module: module as usize,
        })
    }

    /// A request with `headers` arrives; its headers hook's answer is `Request::headers`.
    pub fn request(&self, headers: &[(&str, &str)]) -> Request {
        let filter = {
            let mut state = envoy();
            let id = state.next_id() as usize;
            let headers = headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect();
            let filter = Filter {
                request_headers: headers,
                config: self.envoy,
                ..Filter::default()
            };
            state.filters.insert(id, filter);
            id
        };
        let module = hooks::envoy_dynamic_module_on_http_filter_new(
            self.module as *const c_void,
            filter as *mut c_void,
        );
        if let Some(f) = envoy().filters.get_mut(&filter) {
            f.module = module as usize;
        }
        Request { filter }
    }

    /// Envoy's main thread runs the configuration's scheduled events.
    pub fn main_thread(&self) {
        let events = envoy()
            .configs
            .get_mut(&self.envoy)
            .map(|c| std::mem::take(&mut c.events))
            .unwrap_or_default();
        for event in events {
            config_hooks::envoy_dynamic_module_on_http_filter_config_scheduled(
                self.envoy as *mut c_void,
                self.module as *const c_void,
                event,
            );
        }
    }

    /// The worker runs its requests' scheduled events (of those still alive).
    pub fn worker(&self) {
        let events = envoy()
            .configs
            .get_mut(&self.envoy)
            .map(|c| std::mem::take(&mut c.worker_events))
            .unwrap_or_default();
        for (filter, event) in events {
            let module = {
                let state = envoy();
                match state.filters.get(&filter) {
                    Some(f) if !f.destroyed => f.module,
                    _ => continue,
                }
            };
            hooks::envoy_dynamic_module_on_http_filter_scheduled(
                filter as *mut c_void,
                module as *const c_void,
                event,
            );
        }
    }

    /// Envoy's ids of the streams this configuration opened, oldest first, and whether
    /// each was reset.
    pub fn streams(&self) -> Vec<(u64, bool)> {
        let state = envoy();
        let streams = state.configs.get(&self.envoy).map(|c| &c.streams);
        streams.map_or_else(Vec::new, |s| {
            s.iter().map(|(id, s)| (*id, s.reset)).collect()
        })
    }

    /// The request headers that opened stream `id`.
    pub fn stream_headers(&self, id: u64) -> Vec<(String, Vec<u8>)> {
        let state = envoy();
        let stream = state
            .configs
            .get(&self.envoy)
            .and_then(|c| c.streams.get(&id));
        stream.map_or_else(Vec::new, |s| s.headers.clone())
    }

    /// The messages sent on stream `id` since the last look: exchange id and batch.
    pub fn messages(&self, id: u64) -> Vec<(u32, String)> {
        let mut state = envoy();
        let Some(stream) = state
            .configs
            .get_mut(&self.envoy)
            .and_then(|c| c.streams.get_mut(&id))
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Ok(Some(message)) = stream.sent.next_message() {
            if let Some((id, body)) = split_message(&message) {
                out.push((id, String::from_utf8_lossy(body).into_owned()));
            }
        }
        out
    }

    /// The bridge answers exchange `exchange` on stream `id`: every rule of every check
    /// in `batch` allowed or not, with `remaining` left.
    pub fn answer(&self, id: u64, exchange: u32, batch: &str, allowed: bool, remaining: u64) {
        let lines = parse_batch(batch.as_bytes()).unwrap_or_default();
        let results: Vec<CheckResult> = lines
            .iter()
            .map(|line| {
                let rules = line.as_ref().map_or(0, |l| l.rules.len());
                let rule = RuleResult {
                    allowed,
                    remaining,
                    full_ms: 1_000,
                    wait_ms: if allowed { 0 } else { 1_000 },
                    ..RuleResult::default()
                };
                CheckResult::Checked {
                    now_ms: 1,
                    rules: vec![rule; rules],
                }
            })
            .collect();
        let mut reply = String::new();
        render_reply(&mut reply, &results);
        self.stream_bytes(id, &prefixed(stream_message(exchange, &reply).as_bytes()));
    }

    /// Bytes on stream `id`'s response, after its 200 headers the first time.
    pub fn stream_bytes(&self, id: u64, bytes: &[u8]) {
        let first = {
            let mut state = envoy();
            let stream = state
                .configs
                .get_mut(&self.envoy)
                .and_then(|c| c.streams.get_mut(&id));
            stream.is_some_and(|s| !std::mem::replace(&mut s.answered_headers, true))
        };
        let (envoy_ptr, module) = (self.envoy as *mut c_void, self.module as *const c_void);
        if first {
            let status = [(b":status".as_slice(), b"200".as_slice())];
            let headers: Vec<EnvoyHeader> = status
                .iter()
                .map(|(k, v)| EnvoyHeader {
                    key: lent(k),
                    value: lent(v),
                })
                .collect();
            config_hooks::envoy_dynamic_module_on_http_filter_config_http_stream_headers(
                envoy_ptr,
                module,
                id,
                headers.as_ptr(),
                headers.len(),
                false,
            );
        }
        let chunk = [lent(bytes)];
        config_hooks::envoy_dynamic_module_on_http_filter_config_http_stream_data(
            envoy_ptr,
            module,
            id,
            chunk.as_ptr(),
            1,
            false,
        );
    }

    /// Envoy resets stream `id` (the bridge went away).
    pub fn reset(&self, id: u64) {
        if let Some(stream) = envoy()
            .configs
            .get_mut(&self.envoy)
            .and_then(|c| c.streams.get_mut(&id))
        {
            stream.reset = true;
        }
        config_hooks::envoy_dynamic_module_on_http_filter_config_http_stream_reset(
            self.envoy as *mut c_void,
            self.module as *const c_void,
            id,
            0,
        );
    }

    /// Counter `name`'s value.
    pub fn counter(&self, name: &str) -> u64 {
        let state = envoy();
        let counters = state
            .configs
            .get(&self.envoy)
            .map(|c| c.counters.as_slice());
        let found = counters.unwrap_or_default().iter().find(|(n, _)| n == name);
        found.map_or(0, |(_, n)| *n)
    }

    /// Calls Envoy would not have taken (none, in every test): on this gateway's requests,
    /// and on pointers no gateway's.
    pub fn misuse(&self) -> Vec<String> {
        let state = envoy();
        let own = state.configs.get(&self.envoy).map(|c| c.misuse.clone());
        own.unwrap_or_default()
            .into_iter()
            .chain(state.misuse.clone())
            .collect()
    }

    /// Every stream opened from now on fails to start.
    pub fn refuse_streams(&self) {
        if let Some(config) = envoy().configs.get_mut(&self.envoy) {
            config.refuse_streams = true;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        config_hooks::envoy_dynamic_module_on_http_filter_config_destroy(
            self.module as *const c_void,
        );
    }
}

/// One request of a gateway.
pub struct Request {
    filter: usize,
}

impl Request {
    fn ptrs(&self) -> (*mut c_void, *const c_void) {
        let module = envoy().filters.get(&self.filter).map_or(0, |f| f.module);
        (self.filter as *mut c_void, module as *const c_void)
    }

    /// Its headers hook (`end`: it has no body): the module's answer.
    pub fn headers(&self, end: bool) -> i32 {
        let (filter, module) = self.ptrs();
        hooks::envoy_dynamic_module_on_http_filter_request_headers(filter, module, end)
    }

    /// A chunk of its body arrives (`end`: the last); Envoy buffers it if the module
    /// answers `StopIterationAndBuffer` (1).
    pub fn body(&self, chunk: &[u8], end: bool) -> i32 {
        if let Some(f) = envoy().filters.get_mut(&self.filter) {
            f.received = vec![chunk.to_vec()];
        }
        let (filter, module) = self.ptrs();
        let answer = hooks::envoy_dynamic_module_on_http_filter_request_body(filter, module, end);
        if let Some(f) = envoy().filters.get_mut(&self.filter) {
            let received = std::mem::take(&mut f.received);
            if answer == 1 {
                f.buffered.extend(received);
            }
        }
        answer
    }

    /// The upstream's response headers (`status`) pass the filter.
    pub fn response(&self, status: &str) -> i32 {
        if let Some(f) = envoy().filters.get_mut(&self.filter) {
            f.response_headers = vec![(":status".into(), status.as_bytes().to_vec())];
        }
        let (filter, module) = self.ptrs();
        hooks::envoy_dynamic_module_on_http_filter_response_headers(filter, module, false)
    }

    /// Envoy destroys the request.
    pub fn destroy(&self) {
        let (_, module) = self.ptrs();
        hooks::envoy_dynamic_module_on_http_filter_destroy(module);
        let leaked = envoy().filters.get_mut(&self.filter).map(|f| {
            f.destroyed = true;
            f.schedulers
        });
        if leaked.is_some_and(|n| n > 0) {
            misused(
                self.filter,
                "a request ended with its scheduler never deleted".into(),
            );
        }
    }

    /// What Envoy holds of it.
    pub fn seen<T>(&self, read: impl FnOnce(&Filter) -> T) -> T {
        let state = envoy();
        let none = Filter::default();
        read(state.filters.get(&self.filter).unwrap_or(&none))
    }

    /// The value of response header `name`.
    pub fn response_header(&self, name: &str) -> Option<String> {
        self.seen(|f| {
            let found = f.response_headers.iter().find(|(k, _)| k == name);
            found.map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        })
    }
}
