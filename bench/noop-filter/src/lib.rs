//! A proxy-wasm HTTP filter that lets every request through untouched.
//!
//! The bench loads it in Envoy's V8 runtime as the baseline for "any wasm filter": the
//! difference between it and ratelimit.wasm is the rate limiter's own cost, and the
//! difference between it and no filter at all is the price of the wasm machinery.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

/// Accepts any configuration and hands out one `Noop` per request.
struct NoopRoot;

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request's context: continues at once.
struct Noop;

impl Context for Noop {}

impl HttpContext for Noop {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}
