//! The workers' gRPC streams to the bridge (`transport: "grpc"`, the default), as plumbing:
//! the dispatcher keeps each stream's exchanges, their ids and timeouts, and reopens a
//! closed stream with its backoff, as it does in ratelimit.wasm; here each worker's stream
//! is only carried. Envoy lets only its main thread hold a configuration's streams, so the
//! courier opens, feeds and resets them there, and every message the bridge sends, and a
//! stream's end, goes back to the worker's mailbox under the dispatcher's token for it.
//!
//! A stream is opened on the first message of its token; a token whose stream has ended
//! opens none again (the dispatcher opens another token). Envoy may report a reset from
//! inside the call that opens, sends on or resets a stream, so no lock is held across
//! those calls.

use crate::abi::{self, ConfigEnvoyPtr};
use crate::mailbox::{Answer, Mailbox};
use ratelimit_config::backend::Backend;
use ratelimit_filter::wire::{self, MAX_REPLY_LEN};
use ratelimit_protocol::{Deframer, MAX_ID_LINE};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// gRPC's status for a stream that ended without one of its own (reset, refused, a bad
/// frame): `UNAVAILABLE`.
pub const UNAVAILABLE: u32 = 14;

/// One worker's current stream: the dispatcher's token for it, Envoy's id once open (none
/// once it has ended), and its replies split from its bytes.
struct Stream {
    mailbox: Arc<Mailbox>,
    token: u32,
    envoy_id: Option<u64>,
    replies: Deframer,
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
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    current: HashMap<Worker, Stream>,
    /// Envoy's stream id to its worker.
    workers: HashMap<u64, Worker>,
    /// A stream is being opened: Envoy may reset it before saying its id.
    opening: bool,
    /// Streams Envoy reset while one was being opened.
    reset_early: Vec<u64>,
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
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// On the main thread: sends `frame` (a gRPC message) on stream `token` of `mailbox`'s
    /// worker, opened now if this is the token's first message. A token that has ended
    /// takes nothing (its end is in the mailbox already).
    pub fn send(&self, envoy: ConfigEnvoyPtr, mailbox: &Arc<Mailbox>, token: u32, frame: &[u8]) {
        let Some(envoy_id) = self.stream_of(envoy, mailbox, token) else {
            return;
        };
        if !abi::config_stream_send(envoy, envoy_id, frame) {
            self.closed(envoy_id, UNAVAILABLE);
        }
    }

    /// On the main thread: the dispatcher is done with stream `token`; Envoy resets it if it
    /// is still open.
    pub fn close(&self, envoy: ConfigEnvoyPtr, mailbox: &Arc<Mailbox>, token: u32) {
        let open = {
            let mut state = self.state();
            let stream = state.current.get_mut(&worker(mailbox));
            match stream {
                Some(stream) if stream.token == token => stream.envoy_id.take(),
                _ => None,
            }
        };
        if let Some(envoy_id) = open {
            self.state().workers.remove(&envoy_id);
            abi::config_stream_reset(envoy, envoy_id);
        }
    }

    /// Envoy's id of stream `token` of `mailbox`'s worker, opened now if the token is new;
    /// none if it has ended or does not open (its end then goes to the mailbox). A newer
    /// token replaces the worker's stream: the older one is reset.
    fn stream_of(&self, envoy: ConfigEnvoyPtr, mailbox: &Arc<Mailbox>, token: u32) -> Option<u64> {
        let older = {
            let state = self.state();
            match state.current.get(&worker(mailbox)) {
                Some(stream) if stream.token == token => return stream.envoy_id,
                Some(stream) => stream.envoy_id,
                None => None,
            }
        };
        if let Some(older) = older {
            self.closed(older, UNAVAILABLE);
            abi::config_stream_reset(envoy, older);
        }
        {
            let mut state = self.state();
            state.opening = true;
            state.reset_early.clear();
            let stream = Stream {
                mailbox: Arc::clone(mailbox),
                token,
                envoy_id: None,
                replies: Deframer::with_limit(MAX_ID_LINE + MAX_REPLY_LEN),
            };
            state.current.insert(worker(mailbox), stream);
        }
        let headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let opened = abi::config_stream(envoy, &self.cluster, &headers);
        let envoy_id = {
            let mut state = self.state();
            state.opening = false;
            match opened {
                Ok(id) if !state.reset_early.contains(&id) => {
                    state.workers.insert(id, worker(mailbox));
                    if let Some(stream) = state.current.get_mut(&worker(mailbox)) {
                        stream.envoy_id = Some(id);
                    }
                    Some(id)
                }
                Ok(_) => None,
                Err(result) => {
                    log::warn!("stream to {:?} failed to open ({result})", self.cluster);
                    None
                }
            }
        };
        if envoy_id.is_none() {
            mailbox.deliver(Answer::Closed {
                stream: token,
                status: UNAVAILABLE,
            });
        }
        envoy_id
    }

    /// On the main thread: bytes of stream `id`'s response; each whole message goes to its
    /// worker. A frame gRPC does not allow ends the stream.
    pub fn data(&self, envoy: ConfigEnvoyPtr, id: u64, chunks: &[&[u8]]) {
        let mut messages = Vec::new();
        let mut bad = None;
        let (mailbox, token) = {
            let mut state = self.state();
            let Some(worker) = state.workers.get(&id).copied() else {
                return;
            };
            let Some(stream) = state.current.get_mut(&worker) else {
                return;
            };
            for chunk in chunks {
                stream.replies.push(chunk);
            }
            loop {
                match stream.replies.next_message() {
                    Ok(Some(message)) => messages.push(message),
                    Ok(None) => break,
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            (Arc::clone(&stream.mailbox), stream.token)
        };
        for bytes in messages {
            mailbox.deliver(Answer::Message {
                stream: token,
                bytes,
            });
        }
        if let Some(why) = bad {
            log::warn!("bridge stream: {why}; the stream is reset");
            self.closed(id, UNAVAILABLE);
            abi::config_stream_reset(envoy, id);
        }
    }

    /// On the main thread: the response headers of stream `id`. Anything but a 200 that
    /// stays open ends it (a gRPC error comes as headers alone).
    pub fn headers(&self, envoy: ConfigEnvoyPtr, id: u64, status: Option<u32>, end: bool) {
        if status != Some(200) {
            log::warn!("stream to the bridge answered HTTP {status:?}; it is reset");
            self.closed(id, UNAVAILABLE);
            abi::config_stream_reset(envoy, id);
        } else if end {
            self.closed(id, UNAVAILABLE);
        }
    }

    /// On the main thread: stream `id` ended (gRPC `status`), was reset, or answered other
    /// than 200: its worker's dispatcher hears of it, once.
    pub fn closed(&self, id: u64, status: u32) {
        let ended = {
            let mut state = self.state();
            match state.workers.remove(&id) {
                Some(worker) => state.current.get_mut(&worker).map(|stream| {
                    stream.envoy_id = None;
                    (Arc::clone(&stream.mailbox), stream.token)
                }),
                None => {
                    if state.opening {
                        state.reset_early.push(id);
                    }
                    None
                }
            }
        };
        if let Some((mailbox, token)) = ended {
            mailbox.deliver(Answer::Closed {
                stream: token,
                status,
            });
        }
    }

    /// How many workers' streams are open.
    pub fn open(&self) -> usize {
        self.state().workers.len()
    }

    /// On the main thread, for a configuration that is gone (`teardown`): every stream is
    /// reset.
    pub fn reset_all(&self, envoy: ConfigEnvoyPtr) {
        let ids: Vec<u64> = self.state().workers.keys().copied().collect();
        for id in ids {
            self.closed(id, UNAVAILABLE);
            abi::config_stream_reset(envoy, id);
        }
    }
}
