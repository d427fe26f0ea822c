//! Everything the host knows, kept in the wasmtime `Store` so that each test owns its own
//! world: no global state, so tests run in parallel.

use crate::abi::{first, LogLevel, MapType, Pair, Status};
use crate::callout::{CallResponse, Callout};
use crate::grpc::GrpcState;
use crate::queue::QueueState;
use crate::redis::RedisState;
use std::collections::BTreeMap;
use wasmtime::{Memory, TypedFunc};

/// One line the guest logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    /// The context whose callback was running (the effective one).
    pub context_id: u32,
    pub message: String,
}

/// What a filter did to an HTTP stream, in order, for assertions afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `proxy_continue_stream`: the paused request (0) or response (1) goes on.
    Resumed { stream_type: i32 },
    /// `proxy_close_stream`.
    Closed { stream_type: i32 },
    /// `proxy_send_local_response`.
    LocalReply(LocalReply),
    /// `proxy_add/replace/remove_header_map_value` or `proxy_set_header_map_pairs`.
    HeaderChange {
        map: MapType,
        op: HeaderOp,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// `proxy_http_call` succeeded with this token.
    Dispatched { token: u32 },
}

/// Which header map mutation the guest made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderOp {
    Add,
    Replace,
    Remove,
    SetAll,
}

/// A reply the filter sent instead of letting the request through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub details: Vec<u8>,
    pub headers: Vec<Pair>,
    pub body: Vec<u8>,
    pub grpc_status: i32,
}

impl LocalReply {
    /// First value of a header, as text (lossy), by lower-case name.
    pub fn header(&self, name: &str) -> Option<String> {
        first(&self.headers, name)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP stream (an HTTP context of the guest).
#[derive(Debug, Default, Clone)]
pub struct Stream {
    pub request_headers: Vec<Pair>,
    pub request_body: Vec<u8>,
    pub request_trailers: Vec<Pair>,
    pub response_headers: Vec<Pair>,
    pub response_body: Vec<u8>,
    pub response_trailers: Vec<Pair>,
    /// Properties of this stream, on top of the host's.
    pub properties: BTreeMap<Vec<Vec<u8>>, Vec<u8>>,
    pub events: Vec<Event>,
    /// Set once `proxy_on_done`/`proxy_on_delete` ran: the guest context is gone.
    pub deleted: bool,
}

impl Stream {
    /// The local reply the filter sent, if any.
    pub fn local_reply(&self) -> Option<&LocalReply> {
        self.events.iter().find_map(|e| match e {
            Event::LocalReply(r) => Some(r),
            _ => None,
        })
    }

    /// Whether the filter resumed the paused request.
    pub fn resumed(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, Event::Resumed { stream_type: 0 }))
    }

    pub fn map(&self, map: MapType) -> Option<&Vec<Pair>> {
        match map {
            MapType::RequestHeaders => Some(&self.request_headers),
            MapType::RequestTrailers => Some(&self.request_trailers),
            MapType::ResponseHeaders => Some(&self.response_headers),
            MapType::ResponseTrailers => Some(&self.response_trailers),
            _ => None,
        }
    }

    pub fn map_mut(&mut self, map: MapType) -> Option<&mut Vec<Pair>> {
        match map {
            MapType::RequestHeaders => Some(&mut self.request_headers),
            MapType::RequestTrailers => Some(&mut self.request_trailers),
            MapType::ResponseHeaders => Some(&mut self.response_headers),
            MapType::ResponseTrailers => Some(&mut self.response_trailers),
            _ => None,
        }
    }
}

/// A metric the guest defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// 0 counter, 1 gauge, 2 histogram, as in the ABI.
    pub kind: i32,
    pub name: String,
    pub value: u64,
    /// Every value recorded into a histogram.
    pub recorded: Vec<u64>,
}

/// Fuel one guest callback burnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuelRecord {
    pub callback: &'static str,
    pub context_id: u32,
    pub fuel: u64,
}

/// Fuel one callback may burn; past it the guest is stuck in a loop.
pub const FUEL_PER_CALLBACK: u64 = 20_000_000_000;

/// The host side of one VM.
pub struct HostState {
    /// Wall clock, ns since the epoch; only the test moves it.
    pub now_ns: u64,
    /// Monotonic clock, ns; moves with `now_ns`.
    pub monotonic_ns: u64,
    pub logs: Vec<LogLine>,
    pub vm_config: Vec<u8>,
    pub plugin_config: Vec<u8>,
    /// Id of the plugin's root context (0 until created).
    pub root_id: u32,
    /// The context host calls act on: the callback's, or the one set effective.
    pub effective: u32,
    pub next_context_id: u32,
    pub streams: BTreeMap<u32, Stream>,
    /// Host-wide properties (`plugin_name`, defaults of every stream).
    pub properties: BTreeMap<Vec<Vec<u8>>, Vec<u8>>,
    pub callouts: Vec<Callout>,
    pub next_token: u32,
    /// Clusters a callout may name; `None` accepts any, as a permissive Envoy config would.
    pub clusters: Option<Vec<String>>,
    /// The reply being delivered, only while `proxy_on_http_call_response` runs (as Envoy).
    pub call_response: Option<CallResponse>,
    /// Shared data: key → (value, cas).
    pub shared: BTreeMap<Vec<u8>, (Vec<u8>, u32)>,
    pub metrics: Vec<Metric>,
    pub tick_period_ms: u32,
    /// Wall-clock time (ns) of the next tick, if ticking.
    pub next_tick_ns: Option<u64>,
    /// `proxy_get_status` answer: set by a failed callout, like Envoy's "reset".
    pub last_status: (u32, Vec<u8>),
    /// Contexts that called `proxy_done`.
    pub done_called: Vec<u32>,
    pub redis: RedisState,
    /// gRPC streams the guest opened, and what is being delivered on them.
    pub grpc: GrpcState,
    /// Shared queues the guest registered, and the notifications their enqueues posted.
    pub queues: QueueState,
    /// Deterministic `random_get` (xorshift state).
    pub random_state: u64,
    /// Bytes the guest wrote to fd 1 and 2 (panic messages land here when no hook runs).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// WASI argv and environment, for the test runner.
    pub args: Vec<Vec<u8>>,
    pub env: Vec<Vec<u8>>,
    pub fuel: Vec<FuelRecord>,
    /// Set at instantiation: the guest's memory and allocator.
    pub memory: Option<Memory>,
    pub allocate: Option<TypedFunc<i32, i32>>,
    pub log_level: i32,
    /// Copy the guest's stdout/stderr to the real ones (the WASI test runner wants this).
    pub echo_stdio: bool,
    /// Fuel each call into the guest may burn (`FUEL_PER_CALLBACK` by default).
    pub fuel_per_call: u64,
    /// Host calls (`proxy_...`) answered with this status instead of being served, as a
    /// host that refuses them would (see `hostcalls::make_refusable`).
    pub refused: BTreeMap<String, Status>,
}

impl Default for HostState {
    fn default() -> Self {
        let mut properties = BTreeMap::new();
        for (path, value) in [
            (&["plugin_name"][..], "ratelimit"),
            (&["plugin_root_id"], ""),
            (&["plugin_vm_id"], "harness"),
            (&["source", "address"], "192.0.2.10:50000"),
            (&["destination", "address"], "192.0.2.1:8080"),
        ] {
            let key = path.iter().map(|s| s.as_bytes().to_vec()).collect();
            properties.insert(key, value.as_bytes().to_vec());
        }
        HostState {
            // 2026-01-01T00:00:00Z: a fixed, recognisable start.
            now_ns: 1_767_225_600_000_000_000,
            monotonic_ns: 1_000_000_000,
            logs: Vec::new(),
            vm_config: Vec::new(),
            plugin_config: Vec::new(),
            root_id: 0,
            effective: 0,
            next_context_id: 1,
            streams: BTreeMap::new(),
            properties,
            callouts: Vec::new(),
            next_token: 1,
            clusters: None,
            call_response: None,
            shared: BTreeMap::new(),
            metrics: Vec::new(),
            tick_period_ms: 0,
            next_tick_ns: None,
            last_status: (0, Vec::new()),
            done_called: Vec::new(),
            redis: RedisState::default(),
            grpc: GrpcState::default(),
            queues: QueueState::default(),
            random_state: 0x9e37_79b9_7f4a_7c15,
            stdout: Vec::new(),
            stderr: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            fuel: Vec::new(),
            memory: None,
            allocate: None,
            log_level: 0,
            echo_stdio: false,
            fuel_per_call: FUEL_PER_CALLBACK,
            refused: BTreeMap::new(),
        }
    }
}

impl HostState {
    /// The stream the effective context is, if it is an HTTP context.
    pub fn stream_mut(&mut self) -> Option<&mut Stream> {
        self.streams.get_mut(&self.effective)
    }

    pub fn stream(&self) -> Option<&Stream> {
        self.streams.get(&self.effective)
    }

    /// A property as Envoy resolves it: the stream's own, then the host's.
    pub fn property(&self, path: &[Vec<u8>]) -> Option<Vec<u8>> {
        self.stream()
            .and_then(|s| s.properties.get(path))
            .or_else(|| self.properties.get(path))
            .cloned()
    }

    /// Records a log line the harness itself writes (e.g. a refused host call).
    pub fn host_log(&mut self, message: String) {
        self.logs.push(LogLine {
            level: LogLevel::Debug,
            context_id: self.effective,
            message: format!("[harness] {message}"),
        });
    }
}
