//! A fake Envoy for the module's unit tests: the callbacks the module imports
//! (`request_calls`, `config_calls`), defined under Envoy's own symbols, over a recorded
//! state; and a `Gateway` (`gateway`) that drives the module's hooks as Envoy does (a configuration made on the
//! main thread, requests on the test's thread as a worker, each scheduler's events run
//! when the test says) with a bridge the test answers on each worker's stream.
//!
//! Pointers are numbers the fake hands out, never dereferenced; the module only hands them
//! back. Tests run in parallel, each with its own gateway and its own thread (a worker).

mod config_calls;
mod gateway;
mod request_calls;

pub use gateway::{Gateway, Request};

use crate::abi::{EnvoyBuffer, ModuleBuffer, ModuleHeader};
use ratelimit_protocol::Deframer;
use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

/// Headers as Envoy holds them: name, value.
pub type Headers = Vec<(String, Vec<u8>)>;

/// A local reply: status, headers, body.
pub type Reply = (u32, Headers, Vec<u8>);

/// One request, as Envoy holds it.
#[derive(Default)]
pub struct Filter {
    pub request_headers: Vec<(String, Vec<u8>)>,
    pub response_headers: Vec<(String, Vec<u8>)>,
    received: Vec<Vec<u8>>,
    buffered: Vec<Vec<u8>>,
    response_body: Vec<Vec<u8>>,
    other_body: Vec<Vec<u8>>,
    /// Local replies sent.
    pub answered: Vec<Reply>,
    /// Times the module let it go on after pausing it.
    pub continued: u32,
    /// Its own callouts' bodies.
    pub callouts: Vec<Vec<u8>>,
    /// Schedulers made and not yet deleted.
    schedulers: u32,
    /// Its configuration's Envoy pointer.
    config: usize,
    /// The module's pointer for it.
    module: usize,
    destroyed: bool,
}

/// One stream a configuration opened: what it sent, split into gRPC messages.
pub struct Stream {
    pub headers: Vec<(String, Vec<u8>)>,
    sent: Deframer,
    pub reset: bool,
    answered_headers: bool,
}

impl Stream {
    fn new(headers: Vec<(String, Vec<u8>)>) -> Stream {
        Stream {
            headers,
            sent: Deframer::with_limit(1 << 20),
            reset: false,
            answered_headers: false,
        }
    }
}

/// One configuration, as Envoy holds it.
#[derive(Default)]
struct Config {
    counters: Vec<(String, u64)>,
    /// Its scheduler's events, not yet run.
    events: Vec<u64>,
    /// Its requests' schedulers' events, not yet run: (filter, event). They run on the
    /// request's worker, the thread of the test that made its gateway.
    worker_events: Vec<(usize, u64)>,
    callouts: Vec<Vec<u8>>,
    streams: BTreeMap<u64, Stream>,
    /// Every stream opened from now on fails to start.
    refuse_streams: bool,
    /// Calls on its requests Envoy would have crashed on or ignored.
    misuse: Vec<String>,
}

#[derive(Default)]
pub struct Envoy {
    filters: HashMap<usize, Filter>,
    configs: HashMap<usize, Config>,
    /// Calls on no request this fake made: Envoy would have crashed on them.
    misuse: Vec<String>,
    next: u64,
}

impl Envoy {
    fn next_id(&mut self) -> u64 {
        self.next += 16;
        0x1000 + self.next
    }
}

static ENVOY: LazyLock<Mutex<Envoy>> = LazyLock::new(|| Mutex::new(Envoy::default()));

fn envoy() -> MutexGuard<'static, Envoy> {
    ENVOY.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lent(bytes: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: bytes.as_ptr(),
        length: bytes.len(),
    }
}

/// Records a call Envoy would not have taken, on request `filter` (its gateway's, if it
/// has one).
fn misused(filter: usize, what: String) {
    let mut state = envoy();
    let config = state.filters.get(&filter).map(|f| f.config);
    match config.and_then(|c| state.configs.get_mut(&c)) {
        Some(config) => config.misuse.push(what),
        None => state.misuse.push(what),
    }
}

fn bytes(buffer: &ModuleBuffer) -> Vec<u8> {
    if buffer.ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the module lends the buffer for the call.
    unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.length) }.to_vec()
}

fn text(buffer: &ModuleBuffer) -> String {
    String::from_utf8_lossy(&bytes(buffer)).into_owned()
}

fn pairs(headers: *const ModuleHeader, size: usize) -> Vec<(String, Vec<u8>)> {
    if headers.is_null() {
        return Vec::new();
    }
    // SAFETY: the module lends `size` headers for the call.
    let headers = unsafe { std::slice::from_raw_parts(headers, size) };
    headers
        .iter()
        .map(|h| (text(&h.key), bytes(&h.value)))
        .collect()
}
