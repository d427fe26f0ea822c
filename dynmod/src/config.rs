//! A filter configuration: Envoy makes one on its main thread for each use of the filter
//! (`on_http_filter_config_new`) and shares it with every worker. It holds the plugin
//! configuration as `ratelimit_config::loading` loads it for ratelimit.wasm (the same
//! validation, the same messages) and the counters, which Envoy lets a module define only
//! now: every counter the dispatcher will ask for, the worker's and each rule's.

use crate::abi::{self, ConfigEnvoyPtr};
use crate::courier::Courier;
use crate::courier::TICK;
use ratelimit_config::config::Config;
use ratelimit_config::loading::{self, Build};
use ratelimit_filter::decision::counters::{per_rule_name, Counter, PER_RULE};
use ratelimit_filter::worker::dispatch::Dispatcher;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub struct FilterConfig {
    /// Tells this configuration's dispatchers apart on a worker.
    pub id: u64,
    pub config: Config,
    envoy: ConfigEnvoyPtr,
    counters: HashMap<String, usize>,
    /// How the workers' own exchanges travel, and the main thread is woken.
    pub courier: Courier,
    /// Cleared when Envoy destroys the configuration: its pointer is then gone.
    alive: AtomicBool,
}

// SAFETY: from a worker, Envoy's configuration pointer is only used for counters, which
// Envoy's stats make safe from any thread, and the courier's scheduler, whose commit Envoy
// makes safe from any thread; callouts are the main thread's (`courier`). All of it only
// while the configuration is alive.
unsafe impl Send for FilterConfig {}
// SAFETY: as above; everything else is read-only once made.
unsafe impl Sync for FilterConfig {}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl FilterConfig {
    /// The configuration `json` makes, or why it is refused (logged, and Envoy refuses it).
    pub fn new(envoy: ConfigEnvoyPtr, json: &[u8]) -> Option<FilterConfig> {
        let config = match loading::load(json, Build::Bridge) {
            Ok(config) => config,
            Err(e) => {
                log::error!("{}", loading::refused(&e));
                return None;
            }
        };
        let names = Counter::ALL.iter().map(|c| c.name().to_owned()).chain(
            config
                .rules
                .iter()
                .flat_map(|rule| PER_RULE.iter().map(move |&c| per_rule_name(c, &rule.name))),
        );
        let counters = names
            .filter_map(|name| Some((name.clone(), abi::define_counter(envoy, &name)?)))
            .collect();
        log::info!("{}", loading::accepted(&config));
        let courier = Courier::new(envoy, &config.backend);
        Some(FilterConfig {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            config,
            envoy,
            counters,
            courier,
            alive: AtomicBool::new(true),
        })
    }

    /// The id of counter `name`, defined when the configuration was made.
    pub fn counter(&self, name: &str) -> Option<u32> {
        self.counters
            .get(name)
            .and_then(|&id| u32::try_from(id).ok())
    }

    pub fn add_to_counter(&self, id: u32, n: u64) {
        if self.alive.load(Ordering::Acquire) {
            abi::increment_counter(self.envoy, id as usize, n);
        }
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Envoy destroys the configuration: nothing of it reaches Envoy after this
    /// (`teardown`).
    pub fn retire(&self) {
        self.alive.store(false, Ordering::Release);
        self.courier.close();
    }

    /// On the main thread, for a configuration Envoy is destroying (`teardown`): its
    /// workers' streams are reset.
    pub fn end_streams(&self) {
        if let Some(streams) = &self.courier.streams {
            streams.reset_all(self.envoy);
        }
    }
}

/// Wakes the main thread to tick `config`'s roots (`worker::tick_all`) every base tick of
/// the dispatcher, from a thread of its own, until the configuration is gone: the only
/// timer Envoy lets an HTTP filter module have is one it keeps itself.
pub fn start_ticker(config: &Arc<FilterConfig>) {
    let period = Dispatcher::base_tick(&config.config);
    let config = Arc::downgrade(config);
    let started = std::thread::Builder::new()
        .name("ratelimit-tick".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            match config.upgrade() {
                Some(config) if config.is_alive() => config.courier.wake(TICK),
                _ => return,
            }
        });
    if let Err(e) = started {
        log::error!("no ticker thread ({e}): idle workers' leases end at their next request");
    }
}
