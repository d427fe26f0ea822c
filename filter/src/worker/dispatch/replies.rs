//! The dispatcher's reply events: a message on the worker's stream, the stream closing, the
//! reply to a callout or to a redis call. Each concludes its exchange and sends what waits.

use super::{Call, Dispatcher, Link, Verdicts};
use crate::host::Proxy;
use crate::wire;
use crate::wire::redis_call::{self, Invoke};
use ratelimit_protocol::script::Mode;

impl Dispatcher {
    /// A message on stream `token`: the reply to one exchange, which is concluded; then what
    /// waits leaves at once (group commit).
    pub fn stream_message(
        &mut self,
        token: u32,
        message: &[u8],
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        if self.stream_token() != Some(token) {
            return Vec::new();
        }
        let Some((id, body)) = wire::split_message(message) else {
            log::warn!("bridge sent a stream message without an exchange id");
            return Vec::new(); // its exchange times out
        };
        self.reopen_backoff_ms = 0;
        self.answered(id, host, link, |counts| {
            wire::decode_reply(body, counts).map_err(|bad| bad.0.to_string())
        })
    }

    /// Stream `token` closed: everything in flight or waiting fails, and the stream is
    /// reopened (at once the first time, then after a doubling backoff).
    pub fn stream_closed(
        &mut self,
        token: u32,
        status: u32,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        link.close_stream(token);
        if self.stream_token() != Some(token) {
            return Vec::new();
        }
        self.stream = None;
        let reason = format!("stream to the bridge closed (gRPC status {status})");
        let verdicts = self.abandon_all(&reason, host, link);
        let at_once = self.reopen_backoff_ms == 0;
        self.schedule_reopen(host);
        if at_once {
            self.open_stream(host, link);
        }
        verdicts
    }

    /// The reply to an HTTP callout the dispatcher sent (status `None`: reset or timed out).
    pub fn callout_reply(
        &mut self,
        token: u32,
        status: Option<u32>,
        body: &[u8],
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let Some(call) = self.calls.remove(&token) else {
            return Vec::new();
        };
        self.answered(call.id, host, link, |counts| {
            crate::decision::admission::decode_callout(status, body, counts)
        })
    }

    /// The reply to a redis call (status 0: delivered). A Redis that lost the script gets
    /// the batch once more as `EVAL`.
    pub fn redis_reply(
        &mut self,
        token: u32,
        status: u32,
        reply: &[u8],
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let Some(call) = self.calls.remove(&token) else {
            return Vec::new(); // given up already, or never ours
        };
        let mode =
            (call.redis.as_ref()).map_or(Mode::Check, |(body, _)| redis_call::batch_mode(body));
        let lost_script = status == 0 && redis_call::is_noscript(reply);
        if let (true, Some((body, Invoke::Sha))) = (lost_script, call.redis) {
            log::info!("redis lost the token bucket script; sending it again");
            return self.send_as_text(call.id, body, host, link);
        }
        self.answered(call.id, host, link, |counts| {
            if status != 0 {
                return Err(format!("redis call failed (status {status})"));
            }
            redis_call::decode_reply(reply, mode, counts)
        })
    }

    fn send_as_text(
        &mut self,
        id: u32,
        body: String,
        host: &impl Proxy,
        link: &mut impl Link,
    ) -> Verdicts {
        let sent = match self.generations.last() {
            Some(current) => link.redis_call(&current.config.backend, &body, Invoke::Text),
            None => Err("no configuration".to_string()),
        };
        match sent {
            Ok(token) => {
                let redis = Some((body, Invoke::Text));
                self.calls.insert(token, Call { id, redis });
                Vec::new()
            }
            Err(e) => {
                let mut verdicts = self.fail(id, e, host, link);
                verdicts.extend(self.pump(host, link));
                verdicts
            }
        }
    }
}
