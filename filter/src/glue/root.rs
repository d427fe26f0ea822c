//! The root context of a worker: accepts the configuration, owns the stream to the bridge
//! (opened, timed out and reopened here) and the HTTP callouts it sends, and sends waiting
//! checks the moment an exchange comes back.

use super::abi;
use super::host::{callout_reply, Metrics, ProxyHost};
use super::hub::{carry_out_all, with_worker, Hub, Shared};
use super::request::{Phase, Request};
use super::transport;
use crate::check::{decode_callout, Admission};
use crate::host::Proxy;
use crate::protocol;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use ratelimit_config::backend::Transport;
use ratelimit_config::config::Config;
use ratelimit_config::loading::{self, Build};
use std::rc::Rc;
use std::time::Duration;

/// Longest wait before reopening a stream that keeps closing.
const MAX_REOPEN_BACKOFF_MS: u64 = 5_000;

#[derive(Default)]
pub(super) struct Root {
    /// This root's context id, which the host names in redis-call replies.
    #[cfg(feature = "redis-call")]
    id: u32,
    hub: Rc<Hub>,
    /// The cluster the open stream goes to.
    stream_cluster: String,
    /// Reopening a closed stream waits this long (doubling while it keeps closing).
    reopen_backoff_ms: u64,
    reopen_at_ms: u64,
}

impl Root {
    pub(super) fn new(id: u32) -> Root {
        #[cfg(not(feature = "redis-call"))]
        let _ = id; // only redis-call replies name their root
        Root {
            #[cfg(feature = "redis-call")]
            id,
            ..Root::default()
        }
    }

    /// The tick that times out stream exchanges, reopens the stream and flushes counters.
    fn base_tick(config: &Config) -> Duration {
        Duration::from_millis((config.backend.timeout_ms / 4).clamp(1, 100))
    }

    fn open_stream(&mut self) {
        let Some(shared) = self.hub.shared() else {
            return;
        };
        match transport::open_stream(&shared.config.backend) {
            Ok(token) => {
                self.hub.stream.set(Some(token));
                self.stream_cluster = shared.config.backend.cluster.clone();
            }
            Err(e) => {
                log::warn!("{e}");
                self.schedule_reopen();
            }
        }
    }

    fn schedule_reopen(&mut self) {
        self.reopen_backoff_ms = (self.reopen_backoff_ms * 2).clamp(100, MAX_REOPEN_BACKOFF_MS);
        self.reopen_at_ms = ProxyHost::default().now_ms() + self.reopen_backoff_ms;
    }

    /// Sends what waits (the root owns the callouts it sends).
    fn pump(&mut self) {
        if let Some(shared) = self.hub.shared() {
            self.hub.pump_from_root(&shared);
        }
    }

    /// Fails every exchange in flight and every check waiting (the stream broke).
    fn abandon_all(&mut self, reason: &str) {
        let Some(shared) = self.hub.shared() else {
            return;
        };
        let (lost, waiting) = match self.hub.exchanges.try_borrow_mut() {
            Ok(mut x) => (x.abandon_all(), x.drain_waiting()),
            Err(_) => return,
        };
        let mut verdicts = Vec::new();
        for members in lost.into_iter().chain([waiting]).filter(|m| !m.is_empty()) {
            verdicts.extend(self.hub.settle(&shared, &members, Err(reason.to_string())));
        }
        carry_out_all(&verdicts);
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _: usize,
    ) {
        let callout = self.hub.callouts.try_borrow_mut().ok();
        let Some(id) = callout.and_then(|mut c| c.remove(&token)) else {
            return;
        };
        let (status, body) = callout_reply(num_headers, body_size);
        self.hub
            .answered(id, |counts| decode_callout(status, &body, counts));
    }

    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        if self.hub.stream.get() != Some(token) {
            return;
        }
        let message = transport::stream_message(size);
        let Some((id, body)) = protocol::split_message(&message) else {
            log::warn!("bridge sent a stream message without an exchange id");
            return; // its exchange times out
        };
        self.reopen_backoff_ms = 0;
        self.hub.answered(id, |counts| {
            protocol::decode_reply(body, counts).map_err(|bad| bad.0.to_string())
        });
    }

    fn on_grpc_stream_close(&mut self, token: u32, status: u32) {
        transport::close_stream(token);
        if self.hub.stream.get() != Some(token) {
            return;
        }
        self.hub.stream.set(None);
        self.abandon_all(&format!(
            "stream to the bridge closed (gRPC status {status})"
        ));
        if self.reopen_backoff_ms == 0 {
            self.schedule_reopen();
            self.open_stream();
        } else {
            self.schedule_reopen();
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = abi::buffer(BufferType::PluginConfiguration, usize::MAX).unwrap_or_default();
        let build = if cfg!(feature = "redis-call") {
            Build::RedisCall
        } else {
            Build::Bridge
        };
        let config = match loading::load(&bytes, build) {
            Ok(config) => config,
            Err(e) => {
                log::error!("{}", loading::refused(&e));
                return false;
            }
        };
        #[cfg(feature = "redis-call")]
        if let Err(e) = super::redis::init(self.id, &self.hub, &config.backend) {
            log::error!("{}: backend.redis: {e}", loading::REFUSED);
            return false;
        }
        log::info!("{}", loading::accepted(&config));
        let _ = self.hub.metrics.get_or_init(Metrics::define);
        if self.hub.wake_queue.get().is_none() {
            self.hub.wake_queue.set(transport::register_wake_queue());
        }
        if let Ok(mut x) = self.hub.exchanges.try_borrow_mut() {
            x.set_max_inflight(config.backend.max_inflight);
            // One script call has one mode: checks and lease returns travel apart.
            x.set_one_mode(config.backend.transport == Transport::Redis);
        }
        let _ = abi::set_tick_period(Root::base_tick(&config));
        let backend = config.backend.clone();
        let previous = self.hub.shared.replace(Some(Rc::new(Shared::new(config))));
        // The old configuration's leases end: their tokens go back (sent below or on the
        // next tick, under the new configuration's backend).
        if let Some(old) = previous {
            with_worker(&old, |worker| worker.leases.end_all());
            self.hub.queue_lease_lines(&old);
            // Top-ups out are answered to the new configuration's worker from now on.
            if let Some(new) = self.hub.shared() {
                with_worker(&old, |o| {
                    with_worker(&new, |n| n.leases.adopt_top_ups(&mut o.leases))
                });
            }
        }
        let stream = self.hub.stream.get();
        let wanted = backend.transport == Transport::Grpc;
        if let Some(token) = stream.filter(|_| !wanted || self.stream_cluster != backend.cluster) {
            self.hub.stream.set(None);
            transport::close_stream(token);
            self.abandon_all("the bridge's cluster changed");
        }
        if wanted && self.hub.stream.get().is_none() {
            self.reopen_backoff_ms = 0;
            self.open_stream();
        }
        true
    }

    /// A request asked the root to send what waits.
    fn on_queue_ready(&mut self, queue: u32) {
        transport::drain(queue);
        self.hub.wake_asked.set(false);
        self.pump();
    }

    /// The safety net: gives up stream exchanges past `timeout_ms`, reopens the stream,
    /// sends what waits, flushes the counters.
    fn on_tick(&mut self) {
        let Some(shared) = self.hub.shared() else {
            return;
        };
        let now = ProxyHost::default().now_ms();
        with_worker(&shared, |worker| worker.leases.expire(now));
        self.hub.queue_lease_lines(&shared);
        let backend = &shared.config.backend;
        let waits_for_replies = matches!(backend.transport, Transport::Grpc | Transport::Redis);
        if waits_for_replies {
            let late = match self.hub.exchanges.try_borrow_mut() {
                Ok(mut x) => x.expire(now, backend.timeout_ms),
                Err(_) => Vec::new(),
            };
            let mut verdicts = Vec::new();
            for members in late {
                let reason = Err("no answer within timeout_ms".to_string());
                verdicts.extend(self.hub.settle(&shared, &members, reason));
            }
            carry_out_all(&verdicts);
            #[cfg(feature = "redis-call")]
            super::redis::forget_given_up(&self.hub);
        }
        let reopen = backend.transport == Transport::Grpc && self.hub.stream.get().is_none();
        if reopen && now >= self.reopen_at_ms {
            self.open_stream();
        }
        self.pump();
        if self.hub.wake_asked.replace(false) {
            let _ = abi::set_tick_period(Root::base_tick(&shared.config));
        }
        if let Some(metrics) = self.hub.metrics() {
            metrics.flush();
        }
        shared.flush_rule_counts();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            shared: self.hub.shared()?,
            hub: Rc::clone(&self.hub),
            context_id,
            check: Admission::default(),
            phase: Phase::Idle,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
