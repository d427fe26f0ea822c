//! libratelimit.so: the rate limit filter as a native Envoy dynamic module, loaded by
//! Envoy's `envoy.filters.http.dynamic_modules` filter (`dynamic_module_config: {name:
//! ratelimit}`, `filter_name: ratelimit`, the plugin configuration as `filter_config`).
//!
//! The admission, the dispatcher, leases, the deny cache, the breaker, metering and the
//! configuration are the `ratelimit-filter` and `ratelimit-config` crates, the very code of
//! ratelimit.wasm; this crate is only the second host seam beside proxy-wasm's glue:
//!
//! - `abi`: the C ABI's types and the callbacks Envoy exports, as thin calls.
//! - `guard`: every hook behind `catch_unwind`: a panic fails one request, never Envoy.
//! - `config`: a filter configuration: the plugin configuration loaded and its counters
//!   defined.
//! - `courier`: the worker's batches (group commit) and its own exchanges (settlements,
//!   leases), sent from Envoy's main thread.
//! - `mailbox`: where a worker's answers wait, and the wakers that bring it to them.
//! - `streams`: the workers' gRPC streams to the bridge, which the courier feeds.
//! - `root`: a configuration's state on one worker: its dispatcher, tick and mailbox.
//! - `teardown`: a configuration's end, off the main thread as on it.
//! - `worker`: what each Envoy worker keeps: a dispatcher per configuration, and its
//!   requests.
//! - `host`: the dispatcher's `Proxy` and `Link` over the ABI.
//! - `reply`: a callout's reply as Envoy hands it over.
//! - `request`: one request as its hooks see it.
//! - `hooks`: the hooks of a request's life.
//! - `config_hooks`: the hooks of a configuration, on Envoy's main thread.

mod abi;
mod config;
mod config_hooks;
mod courier;
mod guard;
mod hooks;
mod host;
mod mailbox;
mod reply;
mod request;
mod root;
mod streams;
mod teardown;
mod worker;

#[cfg(test)]
mod fake_envoy;
#[cfg(test)]
mod module_tests;

/// The ABI version Envoy 1.40 was built with; another version only makes Envoy warn.
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Envoy calls this once, when it loads the module: the ABI version it was built for.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    ABI_VERSION.as_ptr()
}

/// The `log` crate's records into Envoy's `dynamic_modules` logger.
struct EnvoyLogger;

static LOGGER: EnvoyLogger = EnvoyLogger;

impl log::Log for EnvoyLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Error => abi::LOG_ERROR,
            log::Level::Warn => abi::LOG_WARN,
            log::Level::Info => abi::LOG_INFO,
            log::Level::Debug | log::Level::Trace => abi::LOG_DEBUG,
        };
        abi::log(level, &format!("[ratelimit] {}", record.args()));
    }

    fn flush(&self) {}
}
