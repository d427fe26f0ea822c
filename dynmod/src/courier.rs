//! The worker's batches (group commit: many requests' checks in one exchange; and its own
//! settlements, lease returns and top-ups) cannot travel in one request's callout, which
//! Envoy cancels when that request ends, and Envoy gives a module's workers nothing that
//! outlives a request. So they go by Envoy's main thread: a worker leaves a parcel and
//! wakes the main thread through the configuration's scheduler; the main thread sends it
//! as a callout the configuration owns (only ever from that thread: Envoy keeps those in a
//! map no lock guards); its answer goes into the worker's mailbox, and the main thread
//! wakes the worker through the scheduler of one of its requests (a waker), whose
//! `on_http_filter_scheduled` hook empties the mailbox into the dispatcher. Where the
//! transport is gRPC, the main thread sends a parcel as a message on the worker's stream
//! instead (`streams`), and a callout only when no stream will take it.

use crate::abi::{self, ConfigEnvoyPtr, FilterSchedulerPtr, SchedulerPtr};
use crate::streams::Streams;
use ratelimit_config::backend::{Backend, Transport};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// An answer: the dispatcher's token, the HTTP status (`None`: reset, timed out, or never
/// sent) and the body.
pub type Answer = (u32, Option<u32>, Vec<u8>);

/// A worker's way in from another thread: the scheduler of one of its requests.
struct Waker(FilterSchedulerPtr);

// SAFETY: Envoy makes committing to and deleting a request's scheduler safe from any thread.
unsafe impl Send for Waker {}

/// Where a worker's answers wait for it, and the wakers that bring it to them.
#[derive(Default)]
pub struct Mailbox {
    answers: Mutex<Vec<Answer>>,
    /// Every request of the worker that has waited for a verdict, until it ends, by context
    /// id: as many as the worker has live requests, each left in constant time.
    wakers: Mutex<HashMap<u32, Waker>>,
}

/// The event a waker's commit runs (`on_http_filter_scheduled`).
pub const WAKE: u64 = 0;

impl Mailbox {
    pub fn deliver(&self, answer: Answer) {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(answer);
        self.wake();
    }

    /// Every answer that came since the last look.
    pub fn take(&self) -> Vec<Answer> {
        std::mem::take(&mut *self.answers.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// From any thread: has the worker take its turn through one of its wakers; false if it
    /// has none, when no request of it waits. A waker whose request is ending drops the
    /// event, but that request's last turn comes after it left the wakers, and finds what
    /// was delivered before (`leave`).
    pub fn wake(&self) -> bool {
        let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        match wakers.values().next() {
            Some(waker) => {
                abi::commit_filter(waker.0, WAKE);
                true
            }
            None => false,
        }
    }

    pub fn has_wakers(&self) -> bool {
        !self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// On the worker: request `context`'s scheduler becomes a waker.
    pub fn add_waker(&self, context: u32, scheduler: FilterSchedulerPtr) {
        let old = self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(context, Waker(scheduler));
        if let Some(old) = old {
            abi::delete_filter_scheduler(old.0);
        }
    }

    /// On the worker, as request `context` ends: its waker is deleted.
    pub fn leave(&self, context: u32) {
        let waker = self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&context);
        if let Some(waker) = waker {
            abi::delete_filter_scheduler(waker.0);
        }
    }
}

/// A callout to send.
pub struct Parcel {
    pub mailbox: Arc<Mailbox>,
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// The configuration scheduler's events.
pub const PARCELS: u64 = 0;
pub const TICK: u64 = 1;

/// One configuration's courier.
pub struct Courier {
    /// The workers' streams, where the transport is gRPC; otherwise every parcel is a
    /// callout.
    pub streams: Option<Streams>,
    /// Gone once the configuration is (`close`): Envoy deletes it on the main thread.
    scheduler: Mutex<Option<SchedulerPtr>>,
    parcels: Mutex<Vec<Parcel>>,
    /// Callouts out, by Envoy's id: whose answer, and its token (the main thread's alone).
    out: Mutex<HashMap<u64, (Arc<Mailbox>, u32)>>,
}

impl Courier {
    /// The courier of `config`, whose parcels go to `backend` by `transport`.
    pub fn new(config: ConfigEnvoyPtr, backend: &Backend, transport: Transport) -> Courier {
        Courier {
            streams: (transport == Transport::Grpc).then(|| Streams::new(backend)),
            scheduler: Mutex::new(Some(abi::config_scheduler(config))),
            parcels: Mutex::new(Vec::new()),
            out: Mutex::new(HashMap::new()),
        }
    }

    /// From a worker: leaves `parcel` and wakes the main thread.
    pub fn post(&self, parcel: Parcel) {
        self.parcels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(parcel);
        self.wake(PARCELS);
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

    /// On the main thread: sends every parcel left.
    pub fn send(&self, config: ConfigEnvoyPtr) {
        let parcels =
            std::mem::take(&mut *self.parcels.lock().unwrap_or_else(PoisonError::into_inner));
        for parcel in parcels {
            let parcel = match &self.streams {
                Some(streams) => match streams.send(config, parcel) {
                    Ok(()) => continue,
                    Err(parcel) => parcel,
                },
                None => parcel,
            };
            let headers: Vec<(&str, &[u8])> = parcel
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            match abi::config_callout(
                config,
                &parcel.cluster,
                &headers,
                &parcel.body,
                parcel.timeout_ms,
            ) {
                Ok(id) => {
                    let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
                    out.insert(id, (parcel.mailbox, parcel.token));
                }
                Err(result) => {
                    log::warn!("callout to {:?} failed to start ({result})", parcel.cluster);
                    parcel.mailbox.deliver((parcel.token, None, Vec::new()));
                }
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
            mailbox.deliver((token, status, body));
        }
    }
}
