//! The worker's batches (group commit: many requests' checks in one exchange; and its own
//! settlements, lease returns and top-ups) cannot travel in one request's callout, which
//! Envoy cancels when that request ends, and Envoy gives a module's workers nothing that
//! outlives a request. So they go by Envoy's main thread: a worker leaves a parcel and
//! wakes the main thread through the configuration's scheduler; the main thread sends it
//! (only ever from that thread: Envoy keeps a configuration's callouts and streams in maps
//! no lock guards), as a message on the worker's stream where the transport is gRPC
//! (`streams`), as a callout the configuration owns over HTTP; what comes back goes into
//! the worker's mailbox, and the main thread wakes the worker through the scheduler of one
//! of its requests (a waker), whose `on_http_filter_scheduled` hook empties the mailbox
//! into the dispatcher.

use crate::abi::{self, ConfigEnvoyPtr, SchedulerPtr};
use crate::mailbox::{Answer, Mailbox};
use crate::streams::{Streams, UNAVAILABLE};
use ratelimit_config::backend::{Backend, Transport};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A callout to send.
pub struct Callout {
    pub mailbox: Arc<Mailbox>,
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// What a worker leaves for the main thread to send.
pub enum Parcel {
    Callout(Callout),
    /// A gRPC message (`frame`) on the worker's stream `stream`.
    Message {
        mailbox: Arc<Mailbox>,
        stream: u32,
        frame: Vec<u8>,
    },
    /// The worker is done with its stream `stream`.
    Close {
        mailbox: Arc<Mailbox>,
        stream: u32,
    },
}

/// The configuration scheduler's events.
pub const PARCELS: u64 = 0;
pub const TICK: u64 = 1;
/// A configuration destroyed on a worker waits for its streams to be reset (`teardown`).
pub const TEARDOWN: u64 = 2;

/// One configuration's courier.
pub struct Courier {
    /// The workers' streams, where the transport is gRPC.
    pub streams: Option<Streams>,
    /// Gone once the configuration is (`close`): Envoy deletes it on the main thread.
    scheduler: Mutex<Option<SchedulerPtr>>,
    parcels: Mutex<Vec<Parcel>>,
    /// Callouts out, by Envoy's id: whose answer, and its token (the main thread's alone).
    out: Mutex<HashMap<u64, (Arc<Mailbox>, u32)>>,
}

impl Courier {
    /// The courier of `config`, whose parcels go to `backend`.
    pub fn new(config: ConfigEnvoyPtr, backend: &Backend) -> Courier {
        Courier {
            streams: (backend.transport == Transport::Grpc).then(|| Streams::new(backend)),
            scheduler: Mutex::new(Some(abi::config_scheduler(config))),
            parcels: Mutex::new(Vec::new()),
            out: Mutex::new(HashMap::new()),
        }
    }

    /// From a worker: leaves `parcel`, and wakes the main thread unless parcels already
    /// wait for it (it takes them all at once).
    pub fn post(&self, parcel: Parcel) {
        let first = {
            let mut parcels = self.parcels.lock().unwrap_or_else(PoisonError::into_inner);
            parcels.push(parcel);
            parcels.len() == 1
        };
        if first {
            self.wake(PARCELS);
        }
    }

    /// From any thread: has the main thread run `event` (`PARCELS`, `TICK`), unless the
    /// configuration is gone.
    pub fn wake(&self, event: u64) {
        let scheduler = self
            .scheduler
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(scheduler) = *scheduler {
            abi::commit(scheduler, event);
        }
    }

    /// On the main thread, when the configuration is destroyed: no event after this.
    pub fn close(&self) {
        let scheduler = self
            .scheduler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(scheduler) = scheduler {
            abi::delete_scheduler(scheduler);
        }
    }

    /// Callouts out, not yet answered.
    pub fn callouts_out(&self) -> usize {
        self.out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Workers' streams open.
    pub fn streams_open(&self) -> usize {
        self.streams.as_ref().map_or(0, Streams::open)
    }

    /// On the main thread: sends every parcel left. A worker's messages that follow one
    /// another on its stream go in one write.
    pub fn send(&self, config: ConfigEnvoyPtr) {
        let parcels =
            std::mem::take(&mut *self.parcels.lock().unwrap_or_else(PoisonError::into_inner));
        let mut parcels = parcels.into_iter().peekable();
        while let Some(parcel) = parcels.next() {
            match parcel {
                Parcel::Callout(callout) => self.call(config, callout),
                Parcel::Message {
                    mailbox,
                    stream,
                    mut frame,
                } => {
                    while let Some(Parcel::Message { frame: next, .. }) = parcels.next_if(
                        |p| matches!(p, Parcel::Message { mailbox: m, stream: s, .. } if Arc::ptr_eq(m, &mailbox) && *s == stream),
                    ) {
                        frame.extend_from_slice(&next);
                    }
                    match &self.streams {
                        Some(streams) => streams.send(config, &mailbox, stream, &frame),
                        None => mailbox.deliver(Answer::Closed {
                            stream,
                            status: UNAVAILABLE,
                        }),
                    }
                }
                Parcel::Close { mailbox, stream } => {
                    if let Some(streams) = &self.streams {
                        streams.close(config, &mailbox, stream);
                    }
                }
            }
        }
    }

    fn call(&self, config: ConfigEnvoyPtr, callout: Callout) {
        let headers: Vec<(&str, &[u8])> = callout
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let sent = abi::config_callout(
            config,
            &callout.cluster,
            &headers,
            &callout.body,
            callout.timeout_ms,
        );
        match sent {
            Ok(id) => {
                let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
                out.insert(id, (callout.mailbox, callout.token));
            }
            Err(result) => {
                log::warn!(
                    "callout to {:?} failed to start ({result})",
                    callout.cluster
                );
                callout.mailbox.deliver(Answer::Callout {
                    token: callout.token,
                    status: None,
                    body: Vec::new(),
                });
            }
        }
    }

    /// On the main thread: callout `id` was answered.
    pub fn answered(&self, id: u64, status: Option<u32>, body: Vec<u8>) {
        let found = self
            .out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some((mailbox, token)) = found {
            mailbox.deliver(Answer::Callout {
                token,
                status,
                body,
            });
        }
    }
}
