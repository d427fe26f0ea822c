//! The dispatcher's view of Envoy through the module ABI: `ModuleHost` (the request being
//! handled, the clock, shared data) and `ModuleLink` (callouts to the bridge, the tick, the
//! counters). A hook of a request that is gone gets a null filter pointer: every call then
//! answers nothing rather than reach Envoy.

use crate::abi::{self, FilterEnvoyPtr};
use crate::courier::{Callout, Parcel};
use crate::root::RootState;
use ratelimit_config::backend::Backend;
use ratelimit_filter::host::header_map::{serialize, HeaderMap};
use ratelimit_filter::host::{Kept, Proxy, RequestView, SharedData, Sole};
use ratelimit_filter::wire;
use ratelimit_filter::wire::redis_call::Invoke;
use ratelimit_filter::worker::dispatch::Link;
use ratelimit_protocol::prefixed;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The request a hook is about (null: none). Only the headers its rules read are fetched,
/// each once, when first read; the whole map only for a request kept for its body.
pub struct ModuleHost {
    filter: FilterEnvoyPtr,
    read: OnceCell<Box<Read>>,
    headers: OnceCell<HeaderMap>,
}

/// The values of one request header read so far, and the next header read: a list that
/// only grows while the host is borrowed, so what it lent stays where it is.
struct Read {
    name: String,
    values: Vec<Vec<u8>>,
    next: OnceCell<Box<Read>>,
}

impl ModuleHost {
    pub fn new(filter: FilterEnvoyPtr) -> ModuleHost {
        ModuleHost {
            filter,
            read: OnceCell::new(),
            headers: OnceCell::new(),
        }
    }

    fn live(&self) -> Option<FilterEnvoyPtr> {
        (!self.filter.is_null()).then_some(self.filter)
    }

    /// Every value of request header `name`, fetched from Envoy the first time.
    fn values(&self, name: &str) -> &[Vec<u8>] {
        let mut slot = &self.read;
        loop {
            match slot.get() {
                Some(read) if read.name == name => return &read.values,
                Some(read) => slot = &read.next,
                None => {
                    let read = slot.get_or_init(|| {
                        let values = self.live().map_or_else(Vec::new, |f| {
                            abi::header_values(f, abi::REQUEST_HEADERS, name)
                        });
                        Box::new(Read {
                            name: name.to_owned(),
                            values,
                            next: OnceCell::new(),
                        })
                    });
                    return &read.values;
                }
            }
        }
    }

    fn headers(&self) -> &HeaderMap {
        self.headers.get_or_init(|| {
            let serialized = self.live().map_or_else(Vec::new, |f| {
                abi::with_headers(f, abi::REQUEST_HEADERS, |pairs| serialize(pairs))
            });
            HeaderMap::new(serialized)
        })
    }
}

impl RequestView for ModuleHost {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.values(name).first().map(Vec::as_slice)
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        Sole::of(self.values(name).iter().map(Vec::as_slice))
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.values(name).iter().map(Vec::as_slice).collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        abi::attribute(self.live()?, abi::SOURCE_ADDRESS)
    }

    fn route_name(&self) -> Option<Vec<u8>> {
        abi::attribute(self.live()?, abi::XDS_ROUTE_NAME)
    }
}

/// `failure_mode: "local"`'s buckets: one store for the process, as proxy-wasm's shared
/// data is one for every worker.
static SHARED: Mutex<Option<Entries>> = Mutex::new(None);

/// Shared data's entries: each value and its version.
type Entries = HashMap<String, (Vec<u8>, u32)>;

impl SharedData for ModuleHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        shared.as_ref()?.get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = shared.get_or_insert_with(HashMap::new);
        let version = entries.get(key).map_or(0, |(_, v)| *v);
        if cas != 0 && cas != version {
            return false;
        }
        entries.insert(
            key.to_owned(),
            (value.to_vec(), version.wrapping_add(1).max(1)),
        );
        true
    }
}

impl Proxy for ModuleHost {
    fn now_ms(&self) -> u64 {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        let set = self
            .live()
            .is_some_and(|f| abi::set_header(f, abi::REQUEST_HEADERS, name, Some(value)));
        if !set {
            log::warn!("could not set request header {name}");
        }
    }

    fn remove_request_header(&self, name: &str) {
        if let Some(filter) = self.live() {
            abi::set_header(filter, abi::REQUEST_HEADERS, name, None);
        }
    }

    /// What Envoy holds of the body: the chunks buffered so far, then the one being
    /// delivered (Envoy buffers it only once the hook returns).
    fn request_body(&self) -> Vec<u8> {
        let mut body = Vec::new();
        if let Some(filter) = self.live() {
            for kind in [abi::BUFFERED_REQUEST_BODY, abi::RECEIVED_REQUEST_BODY] {
                abi::each_body_chunk(filter, kind, |chunk| body.extend_from_slice(chunk));
            }
        }
        body
    }

    fn replace_request_body(&self, _held: usize, body: &[u8]) {
        let replaced = self.live().is_some_and(|f| {
            abi::replace_body(f, abi::BUFFERED_REQUEST_BODY, &[])
                && abi::replace_body(f, abi::RECEIVED_REQUEST_BODY, body)
        });
        if !replaced {
            log::warn!("could not replace the request body");
        }
    }

    fn keep(&self) -> Kept {
        Kept::new(
            self.headers().clone(),
            self.source_address(),
            self.route_name(),
        )
    }
}

/// How the dispatcher reaches out during one turn.
pub struct ModuleLink<'a> {
    /// The request whose hook this is (null: none).
    filter: FilterEnvoyPtr,
    root: &'a RootState,
    /// A wake-up was asked for during the turn.
    pub wake: bool,
}

impl ModuleLink<'_> {
    pub fn new(filter: FilterEnvoyPtr, root: &RootState) -> ModuleLink<'_> {
        ModuleLink {
            filter,
            root,
            wake: false,
        }
    }
}

impl Link for ModuleLink<'_> {
    /// The message leaves from the main thread, which holds the worker's stream
    /// (`streams`); a stream that cannot take it ends, and the dispatcher hears so.
    fn stream_send(&mut self, token: u32, id: u32, body: &str) -> Result<(), String> {
        let message = wire::stream_message(id, body);
        self.root.config.courier.post(Parcel::Message {
            mailbox: Arc::clone(&self.root.mailbox),
            stream: token,
            frame: prefixed(message.as_bytes()),
        });
        Ok(())
    }

    /// A batch of the worker's (group commit, settlements, lease lines): sent by the
    /// courier from Envoy's main thread, as no request's callout outlives it.
    fn callout(&mut self, backend: &Backend, body: &str) -> Result<u32, String> {
        let token = self.root.token();
        self.root.config.courier.post(Parcel::Callout(Callout {
            mailbox: Arc::clone(&self.root.mailbox),
            token,
            cluster: backend.cluster.clone(),
            headers: wire::callout_headers(backend)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: body.as_bytes().to_vec(),
            timeout_ms: backend.timeout_ms,
        }));
        Ok(token)
    }

    /// Owned by the request whose hook this is: its answer comes to that request.
    fn own_callout(
        &mut self,
        _context_id: u32,
        backend: &Backend,
        body: &str,
    ) -> Result<u32, String> {
        if self.filter.is_null() {
            return Err("no request to send a callout from".into());
        }
        let headers = wire::callout_headers(backend);
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let id = abi::callout(
            self.filter,
            &backend.cluster,
            &headers,
            body.as_bytes(),
            backend.timeout_ms,
        )
        .map_err(|result| {
            format!(
                "callout to {:?} failed to start ({result})",
                backend.cluster
            )
        })?;
        let _ = id; // its reply comes to this request's hook, which is all it needs
        Ok(self.root.token())
    }

    fn redis_call(&mut self, _: &Backend, _: &str, _: Invoke) -> Result<u32, String> {
        Err("this build has no redis call".into())
    }

    /// The stream opens on the main thread with its first message (`streams`).
    fn open_stream(&mut self, _: &Backend) -> Result<u32, String> {
        Ok(self.root.token())
    }

    fn close_stream(&mut self, token: u32) {
        self.root.config.courier.post(Parcel::Close {
            mailbox: Arc::clone(&self.root.mailbox),
            stream: token,
        });
    }

    fn post_wake(&mut self) -> bool {
        self.wake = true;
        true
    }

    fn set_tick(&mut self, period: Duration) {
        let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        self.root.period_ms.store(ms, Ordering::Relaxed);
    }

    fn define_counter(&mut self, name: &str) -> Option<u32> {
        self.root.config.counter(name)
    }

    fn add_to_counter(&mut self, id: u32, n: u64) {
        self.root.config.add_to_counter(id, n);
    }
}
