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

use crate::abi::{self, ConfigEnvoyPtr, SchedulerPtr};
use crate::mailbox::Mailbox;
use crate::streams::Streams;
use ratelimit_config::backend::{Backend, Transport};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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
/// A configuration destroyed on a worker waits for its streams to be reset (`teardown`).
pub const TEARDOWN: u64 = 2;

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

    /// On the main thread: sends every parcel left.
    pub fn send(&self, config: ConfigEnvoyPtr) {
        let parcels =
            std::mem::take(&mut *self.parcels.lock().unwrap_or_else(PoisonError::into_inner));
        for parcel in parcels {
            let sent = self.streams.as_ref().is_some_and(|streams| {
                streams.send(config, &parcel.mailbox, parcel.token, &parcel.body)
            });
            if sent {
                continue;
            }
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
