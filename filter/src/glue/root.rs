//! The root context of a worker: accepts the configuration and hands every worker-wide
//! event (replies, the stream closing, ticks, wake-ups) to the worker's dispatcher.

use super::abi;
use super::executor::run;
use super::link::{register_wake_queue, HostLink};
use super::proxy::{callout_reply, stream_message, ProxyHost};
use super::request::Request;
use crate::worker::dispatch::{Dispatcher, Verdicts};
use crate::worker::stage::Stage;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use ratelimit_config::loading::{self, Build};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
pub(super) struct Root {
    /// This root's context id, which the host names in redis-call replies.
    #[cfg(feature = "redis-call")]
    id: u32,
    dispatcher: Rc<RefCell<Dispatcher>>,
    /// The worker's wake-up queue, registered with the first configuration.
    queue: Option<u32>,
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

    fn run(&self, event: impl FnOnce(&mut Dispatcher, &ProxyHost, &mut HostLink) -> Verdicts) {
        run(&self.dispatcher, self.queue, None, |d, host, link| {
            ((), event(d, host, link))
        });
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
        let (status, body) = callout_reply(num_headers, body_size);
        self.run(|d, host, link| d.callout_reply(token, status, &body, host, link));
    }

    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        let message = stream_message(size);
        self.run(|d, host, link| d.stream_message(token, &message, host, link));
    }

    fn on_grpc_stream_close(&mut self, token: u32, status: u32) {
        self.run(|d, host, link| d.stream_closed(token, status, host, link));
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
        if self.queue.is_none() {
            self.queue = register_wake_queue();
        }
        #[cfg(feature = "redis-call")]
        if let Err(e) = super::redis::init(self.id, &self.dispatcher, self.queue, &config.backend) {
            log::error!("{}: backend.redis: {e}", loading::REFUSED);
            return false;
        }
        log::info!("{}", loading::accepted(&config));
        self.run(|d, host, link| d.configure(config, host, link));
        true
    }

    /// A request asked for a wake-up to send what waits.
    fn on_queue_ready(&mut self, queue: u32) {
        while abi::dequeue(queue).is_some() {}
        self.run(|d, host, link| d.wake(host, link));
    }

    fn on_tick(&mut self) {
        self.run(|d, host, link| d.tick(host, link));
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let configured = self
            .dispatcher
            .try_borrow()
            .is_ok_and(|d| d.is_configured());
        configured.then(|| -> Box<dyn HttpContext> {
            Box::new(Request {
                context_id,
                dispatcher: Rc::clone(&self.dispatcher),
                queue: self.queue,
                stage: Stage::default(),
            })
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
