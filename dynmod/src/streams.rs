//! The courier's gRPC streams to the bridge (`transport: "grpc"`, the default): one per
//! worker, as the wasm filter keeps one, but opened and fed by Envoy's main thread, which
//! alone may hold a configuration's streams. A batch then costs Envoy a message on an open
//! stream rather than a new callout (a new async-client request, its header maps, a router
//! of its own). The bridge answers each message by the id in its envelope, in any order;
//! each message gets an id of the courier's, which names whose answer it is.
//!
//! Envoy gives these streams no timeout: a message unanswered within `timeout_ms` is given
//! up at the courier's tick, as the dispatcher gives up a stream exchange. A stream that
//! ends, resets or speaks anything but gRPC fails what it carried, and the next parcel
//! opens another. Envoy may report a reset from inside the call that opens, sends on or
//! resets a stream, so no lock is held across those calls.

use crate::abi::{self, ConfigEnvoyPtr};
use crate::mailbox::{Answer, Mailbox};
use ratelimit_config::backend::Backend;
use ratelimit_filter::wire::{self, MAX_REPLY_LEN};
use ratelimit_protocol::{prefixed, Deframer, MAX_ID_LINE};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One worker's stream: Envoy's id for it, its replies split from its bytes, and the
/// messages it carries that await their answer, by message id: whose token, sent when.
struct Stream {
    mailbox: Arc<Mailbox>,
    envoy_id: u64,
    replies: Deframer,
    out: HashMap<u32, (u32, Instant)>,
}

/// A worker, by its mailbox's address (its mailbox is held here, so the address is not
/// reused while it is a key).
type Worker = usize;

fn worker(mailbox: &Arc<Mailbox>) -> Worker {
    Arc::as_ptr(mailbox) as usize
}

pub struct Streams {
    cluster: String,
    /// The request headers that open a stream: the bridge's gRPC path and the backend's
    /// token.
    headers: Vec<(String, Vec<u8>)>,
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    open: HashMap<Worker, Stream>,
    /// Envoy's stream id to its worker.
    workers: HashMap<u64, Worker>,
    /// A stream is being opened: Envoy may reset it before saying its id.
    opening: bool,
    /// Streams Envoy reset while one was being opened.
    reset_early: Vec<u64>,
    next_message: u32,
}

impl Streams {
    pub fn new(backend: &Backend) -> Streams {
        let path = format!("/{}/{}", wire::GRPC_SERVICE, wire::GRPC_METHOD);
        let mut headers = vec![
            (":method".to_owned(), b"POST".to_vec()),
            (":path".to_owned(), path.into_bytes()),
            (
                ":authority".to_owned(),
                backend.authority.as_bytes().to_vec(),
            ),
            ("content-type".to_owned(), b"application/grpc".to_vec()),
            ("te".to_owned(), b"trailers".to_vec()),
        ];
        for (name, value) in wire::stream_metadata(backend) {
            headers.push((name.to_owned(), value.to_vec()));
        }
        Streams {
            cluster: backend.cluster.clone(),
            headers,
            timeout: Duration::from_millis(backend.timeout_ms),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// On the main thread: sends the batch `body`, whose answer goes to `mailbox` under
    /// `token`, on the worker's stream, opened if need be; false if no stream would take it
    /// (the courier then sends it as a callout).
    pub fn send(
        &self,
        envoy: ConfigEnvoyPtr,
        mailbox: &Arc<Mailbox>,
        token: u32,
        body: &[u8],
    ) -> bool {
        let Some(stream_id) = self.stream_of(envoy, mailbox) else {
            return false;
        };
        let body = String::from_utf8_lossy(body);
        let message = {
            let mut state = self.state();
            let id = state.next_message;
            state.next_message = id.wrapping_add(1);
            let Some(stream) = state.open.get_mut(&worker(mailbox)) else {
                return false;
            };
            stream.out.insert(id, (token, Instant::now()));
            ratelimit_protocol::stream_message(id, &body)
        };
        if !abi::config_stream_send(envoy, stream_id, &prefixed(message.as_bytes())) {
            self.closed(stream_id, "gone");
        }
        true
    }

    /// The open stream of `mailbox`'s worker, opened now if it has none.
    fn stream_of(&self, envoy: ConfigEnvoyPtr, mailbox: &Arc<Mailbox>) -> Option<u64> {
        if let Some(stream) = self.state().open.get(&worker(mailbox)) {
            return Some(stream.envoy_id);
        }
        {
            let mut state = self.state();
            state.opening = true;
            state.reset_early.clear();
        }
        let headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let opened = abi::config_stream(envoy, &self.cluster, &headers);
        let mut state = self.state();
        state.opening = false;
        let envoy_id = match opened {
            Ok(id) => id,
            Err(result) => {
                log::warn!("stream to {:?} failed to open ({result})", self.cluster);
                return None;
            }
        };
        if state.reset_early.contains(&envoy_id) {
            return None;
        }
        let stream = Stream {
            mailbox: Arc::clone(mailbox),
            envoy_id,
            replies: Deframer::with_limit(MAX_ID_LINE + MAX_REPLY_LEN),
            out: HashMap::new(),
        };
        state.workers.insert(envoy_id, worker(mailbox));
        state.open.insert(worker(mailbox), stream);
        Some(envoy_id)
    }

    /// On the main thread: bytes of stream `id`'s response; each whole message answers
    /// its exchange. A frame gRPC does not allow ends the stream.
    pub fn data(&self, envoy: ConfigEnvoyPtr, id: u64, chunks: &[&[u8]]) {
        let mut answers: Vec<Answer> = Vec::new();
        let mut bad = None;
        let mailbox = {
            let mut state = self.state();
            let Some(stream) = state.workers.get(&id).copied() else {
                return;
            };
            let Some(stream) = state.open.get_mut(&stream) else {
                return;
            };
            for chunk in chunks {
                stream.replies.push(chunk);
            }
            loop {
                match stream.replies.next_message() {
                    Ok(Some(message)) => match ratelimit_protocol::split_message(&message) {
                        Some((message_id, body)) => {
                            if let Some((token, _)) = stream.out.remove(&message_id) {
                                answers.push((token, Some(200), body.to_vec()));
                            }
                        }
                        None => {
                            bad = Some("a message without an exchange id".to_owned());
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            Arc::clone(&stream.mailbox)
        };
        for answer in answers {
            mailbox.deliver(answer);
        }
        if let Some(why) = bad {
            log::warn!("bridge stream: {why}; the stream is reset");
            self.closed(id, "reset for a bad frame");
            abi::config_stream_reset(envoy, id);
        }
    }

    /// On the main thread: the response headers of stream `id`. Anything but a 200 that
    /// stays open ends it (a gRPC error comes as headers alone).
    pub fn headers(&self, envoy: ConfigEnvoyPtr, id: u64, status: Option<u32>, end: bool) {
        if status != Some(200) {
            self.closed(id, &format!("answered HTTP {status:?}"));
            abi::config_stream_reset(envoy, id);
        } else if end {
            self.closed(id, "ended");
        }
    }

    /// On the main thread: stream `id` ended, reset, or answered other than 200. What it
    /// carried fails; the worker's next parcel opens another.
    pub fn closed(&self, id: u64, why: &str) {
        let stream = {
            let mut state = self.state();
            match state.workers.remove(&id) {
                Some(worker) => state.open.remove(&worker),
                None => {
                    if state.opening {
                        state.reset_early.push(id);
                    }
                    None
                }
            }
        };
        let Some(stream) = stream else {
            return;
        };
        if !stream.out.is_empty() {
            log::warn!(
                "stream to the bridge {why} with {} exchanges unanswered",
                stream.out.len()
            );
        }
        for (token, _) in stream.out.into_values() {
            stream.mailbox.deliver((token, None, Vec::new()));
        }
    }

    /// How many workers' streams are open.
    pub fn open(&self) -> usize {
        self.state().open.len()
    }

    /// On the main thread, for a configuration that is gone (`teardown`): every stream is
    /// reset, failing what it carried.
    pub fn reset_all(&self, envoy: ConfigEnvoyPtr) {
        let ids: Vec<u64> = self.state().workers.keys().copied().collect();
        for id in ids {
            self.closed(id, "reset: its configuration is gone");
            abi::config_stream_reset(envoy, id);
        }
    }

    /// On the main thread, at the courier's tick: gives up messages unanswered within
    /// `timeout_ms`.
    pub fn expire(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        for stream in self.state().open.values_mut() {
            stream.out.retain(|_, (token, sent)| {
                let keep = now.duration_since(*sent) < self.timeout;
                if !keep {
                    expired.push((Arc::clone(&stream.mailbox), *token));
                }
                keep
            });
        }
        for (mailbox, token) in expired {
            mailbox.deliver((token, None, Vec::new()));
        }
    }
}
