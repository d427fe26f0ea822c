//! A proxy-wasm HTTP filter that does nothing, exactly one trivial callout per request, or
//! exactly the host calls an allowed response of a rate limiter needs.
//!
//! The bench loads it in Envoy's V8 runtime as the baseline for "any wasm filter": the
//! difference between it and ratelimit.wasm is the rate limiter's own cost, and the
//! difference between it and no filter at all is the price of the wasm machinery.
//!
//! With an empty plugin configuration it lets every request through untouched. With
//! `{"callout": {"cluster": "NAME", "authority": "x", "path": "/"}}` it pauses each request,
//! sends one HTTP callout (`dispatch_http_call`) to that cluster and resumes on the reply:
//! the **callout floor**, what any design making one callout per request pays at least.
//! A callout that fails or comes back without a status is answered 503, so a broken floor
//! shows up in the bench's statuses instead of passing for a fast one.
//!
//! With `{"headers": {"identity": "x-user-id"}}` it makes, per request, only the host calls
//! that any filter admitting a client by header and telling it its limit must make: it reads
//! the request's header map whole (one value of the identity header is not enough, a
//! filter must see a repeated one), reads the clock, and adds `X-RateLimit-Limit`,
//! `-Remaining` and `-Reset` to the response: the **headers floor**, which a rate limiter that
//! admits without a callout (a lease, a local bucket) approaches but cannot go below.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use serde::Deserialize;
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot::default()) });
}}

/// How long a callout may take before Envoy answers it as failed.
const CALLOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// The plugin configuration: empty (or `{}`) for a no-op.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Where each request's one callout goes; `None`: no callout at all.
    callout: Option<Callout>,
    /// The headers floor's host calls; `None`: none.
    headers: Option<Headers>,
}

/// The headers floor: which request header names the client.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Headers {
    /// Looked up in the whole request header map, lowercase as Envoy hands it over.
    identity: String,
}

/// One trivial request per request: `GET path` with `:authority` to `cluster`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Callout {
    /// The Envoy cluster of the responder (HTTP/2 in the bench).
    cluster: String,
    /// `:authority` of the callout; the responder ignores it, Envoy requires one.
    authority: String,
    /// `:path` of the callout.
    path: String,
}

/// Parses the configuration and hands it to one `Noop` per request.
#[derive(Default)]
struct NoopRoot {
    /// Shared with every request; replaced whole on reconfiguration.
    config: Rc<Config>,
}

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            self.config = Rc::default();
            return true;
        }
        match serde_json::from_slice::<Config>(&bytes) {
            Ok(config) => {
                self.config = Rc::new(config);
                true
            }
            Err(e) => {
                log::error!("invalid no-op filter configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop {
            config: Rc::clone(&self.config),
            shown: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request's context: continues at once, or after its callout.
struct Noop {
    config: Rc<Config>,
    /// The headers floor's figures for the response: identity values seen, and the clock in
    /// seconds; `None` until the request headers were read.
    shown: Option<(usize, u64)>,
}

impl Context for Noop {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, _: usize, _: usize) {
        // A reset or timed-out callout comes back without headers.
        let result = if num_headers > 0 {
            hostcalls::resume_http_request()
        } else {
            hostcalls::send_http_response(503, vec![], Some(b"callout failed\n"))
        };
        if let Err(e) = result {
            log::warn!("could not finish the request: {e:?}");
        }
    }
}

impl HttpContext for Noop {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(headers) = &self.config.headers {
            let seen = hostcalls::get_map_bytes(MapType::HttpRequestHeaders)
                .map(|map| {
                    let name = headers.identity.as_bytes();
                    map.iter().filter(|(key, _)| key.as_bytes() == name).count()
                })
                .unwrap_or_default();
            let now = hostcalls::get_current_time()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            self.shown = Some((seen, now));
        }
        let Some(callout) = &self.config.callout else {
            return Action::Continue;
        };
        let headers = vec![
            (":method", "GET"),
            (":path", callout.path.as_str()),
            (":authority", callout.authority.as_str()),
        ];
        match self.dispatch_http_call(&callout.cluster, headers, None, vec![], CALLOUT_TIMEOUT) {
            Ok(_) => Action::Pause,
            Err(e) => {
                log::warn!("callout to {} failed: {e:?}", callout.cluster);
                let _ = hostcalls::send_http_response(503, vec![], Some(b"no callout\n"));
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some((seen, now)) = self.shown {
            for (name, value) in [
                ("x-ratelimit-limit", 1_000_000_000),
                (
                    "x-ratelimit-remaining",
                    999_999_999u64.saturating_sub(seen as u64),
                ),
                ("x-ratelimit-reset", now % 60),
            ] {
                if let Err(e) =
                    hostcalls::add_map_value(MapType::HttpResponseHeaders, name, &value.to_string())
                {
                    log::warn!("could not add {name}: {e:?}");
                }
            }
        }
        Action::Continue
    }
}
