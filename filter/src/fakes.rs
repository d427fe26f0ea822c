//! The unit tests' stand-ins for the host (`host`'s traits), the example configuration and
//! the planned rule the modules' tests feed the code, in one place: a request of raw header
//! bytes, shared data with Envoy's versioning, and both with a clock. And the builders the
//! admission's tests share, one file per topic (`decision/admission_*tests.rs`): an
//! admission started, concluded by a reply, whether a request would ask the bridge, and
//! what its response shows.

use crate::decision::admission::{
    conclude_exchange, decode_callout, Admission, Concluding, Start, Verdict, Worker,
};
use crate::decision::response::{LocalReply, RateLimitFields};
use crate::host::header_map::{self, HeaderMap};
use crate::host::{Kept, Proxy, RequestView, SharedData, Sole};
use crate::request::rules::PlannedRule;
use ratelimit_config::config::Config;
use ratelimit_config::limit::Limit;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The configuration the README and docs/configuration.md show (`filter/example-config.json`).
pub const EXAMPLE: &str = include_str!("../example-config.json");

/// `EXAMPLE` parsed, its `failure_mode` (`closed`) made `failure_mode`.
pub fn example(failure_mode: &str) -> Config {
    let json = EXAMPLE.replace(
        r#""failure_mode": "closed""#,
        &format!(r#""failure_mode": "{failure_mode}""#),
    );
    Config::parse(json.as_bytes()).unwrap()
}

/// What `FakeRequest::reads` records for a read of the route's name.
pub const ROUTE_READ: &str = "(route name)";

/// `num` tokens every `den` ms into a bucket of `burst`, as written (`Limit::new` would
/// reduce the rate): `requests` is `num` and `per_ms` is `den`.
pub fn limit(burst: u64, num: u64, den: u64) -> Limit {
    Limit {
        requests: num,
        per_ms: den,
        burst,
        num,
        den,
        calendar: None,
    }
}

/// Rule 0 planned on bucket `key` with `limit(burst, num, den)` for a request of `cost`:
/// no lease, no block, enforced.
pub fn planned(key: &str, burst: u64, num: u64, den: u64, cost: u64) -> PlannedRule {
    PlannedRule {
        rule: 0,
        key: key.into(),
        limit: limit(burst, num, den),
        cost,
        lease: 0,
        block: None,
        shadow: false,
        slot: None,
    }
}

/// A request made of raw header bytes and a peer address.
#[derive(Default)]
pub struct FakeRequest {
    /// Every header line in order; a name may come more than once.
    pub headers: Vec<(String, Vec<u8>)>,
    pub peer: Option<Vec<u8>>,
    /// Every header the filter asked for, in order, and `ROUTE_READ` for each read of the
    /// route's name (each is a host call in a real proxy).
    pub reads: RefCell<Vec<String>>,
    /// The route's name.
    pub route: Option<Vec<u8>>,
}

impl FakeRequest {
    /// The request with header `name` set to `value` (replacing any copies of it).
    pub fn with(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self.also(name, value)
    }

    /// The request with one more copy of header `name`, after those it has.
    pub fn also(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// The request carries `name` a second time (with another value).
    pub fn twice(self, name: &str) -> Self {
        self.also(name, "(a second copy)")
    }

    pub fn peer_at(mut self, addr: &str) -> Self {
        self.peer = Some(addr.as_bytes().to_vec());
        self
    }

    fn values<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.reads.borrow_mut().push(name.to_string());
        let name = name.to_string();
        self.headers
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| v.as_slice())
    }
}

impl RequestView for FakeRequest {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.values(name).next()
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        Sole::of(self.values(name))
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.values(name).collect()
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        self.peer.clone()
    }

    fn route_name(&self) -> Option<Vec<u8>> {
        self.reads.borrow_mut().push(ROUTE_READ.to_string());
        self.route.clone()
    }
}

/// Shared data as Envoy keeps it: a version per key, bumped on every write.
#[derive(Default)]
pub struct FakeShared(pub RefCell<HashMap<String, (Vec<u8>, u32)>>);

impl SharedData for FakeShared {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.0.borrow().get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        let mut map = self.0.borrow_mut();
        let version = map.get(key).map_or(0, |(_, v)| *v);
        if cas != 0 && cas != version {
            return false;
        }
        map.insert(key.into(), (value.to_vec(), version + 1));
        true
    }
}

/// A request plus the host's clock and shared data.
pub struct FakeProxy {
    pub req: FakeRequest,
    pub shared: FakeShared,
    pub now: Cell<u64>,
    /// Every request header the filter set, in order.
    pub set: RefCell<Vec<(String, Vec<u8>)>>,
    /// Every request header the filter removed, in order.
    pub removed: RefCell<Vec<String>>,
    /// The request's body, as the host holds it.
    pub body: RefCell<Vec<u8>>,
}

impl RequestView for FakeProxy {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.req.header(name)
    }

    fn sole_header(&self, name: &str) -> Sole<'_> {
        self.req.sole_header(name)
    }

    fn header_list(&self, name: &str) -> Vec<&[u8]> {
        self.req.header_list(name)
    }

    fn source_address(&self) -> Option<Vec<u8>> {
        self.req.source_address()
    }

    fn route_name(&self) -> Option<Vec<u8>> {
        self.req.route_name()
    }
}

impl SharedData for FakeProxy {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.shared.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        self.shared.set(key, value, cas)
    }
}

impl Proxy for FakeProxy {
    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        self.set.borrow_mut().push((name.into(), value.to_vec()));
    }

    fn remove_request_header(&self, name: &str) {
        self.removed.borrow_mut().push(name.into());
    }

    fn request_body(&self) -> Vec<u8> {
        self.body.borrow().clone()
    }

    fn replace_request_body(&self, held: usize, body: &[u8]) {
        assert_eq!(held, self.body.borrow().len(), "the whole body is replaced");
        *self.body.borrow_mut() = body.to_vec();
    }

    fn keep(&self) -> Kept {
        let map = HeaderMap::new(header_map::serialize(&self.req.headers));
        Kept::new(map, self.req.peer.clone(), self.req.route.clone())
    }
}

/// A GET of `/api/search` by user `alice` from 198.51.100.4, at `now` ms: the request the
/// example configuration's rules are tried on.
pub fn alice_searching(now: u64) -> FakeProxy {
    FakeProxy {
        req: FakeRequest::default()
            .with(":method", "GET")
            .with(":path", "/api/search")
            .with("x-user-id", "alice")
            .peer_at("198.51.100.4:1"),
        shared: FakeShared::default(),
        now: Cell::new(now),
        set: RefCell::default(),
        removed: RefCell::default(),
        body: RefCell::default(),
    }
}

/// The checks' request: `alice_searching` at 1_000_000 ms.
pub fn host() -> FakeProxy {
    alice_searching(1_000_000)
}

/// `host` once the request's headers have gone upstream (a request held for its body):
/// Envoy lets a filter read them no more, so what the filter needs of them it kept.
pub fn headers_gone() -> FakeProxy {
    FakeProxy {
        req: FakeRequest::default(),
        ..host()
    }
}

/// A started check, its worker and the callout body.
pub fn started(config: &Config, host: &FakeProxy) -> (Admission, Worker, String) {
    let mut worker = Worker::new(config);
    let mut admission = Admission::default();
    let Start::Ask(body) = admission.start(config, &mut worker, host) else {
        panic!("no callout")
    };
    (admission, worker, body)
}

/// `started` on `host`, then `conclude`d by `status` and `body`: the admission, the worker
/// (with what it learnt: deny cache, leases) and the verdict.
pub fn concluded(
    config: &Config,
    host: &FakeProxy,
    status: Option<u32>,
    body: &[u8],
) -> (Admission, Worker, Verdict) {
    let (mut admission, mut worker, _) = started(config, host);
    let verdict = conclude(config, &mut worker, host, &mut admission, status, body);
    (admission, worker, verdict)
}

/// `concluded` on `host()`: the admission and its verdict.
pub fn finish(config: &Config, status: Option<u32>, body: &[u8]) -> (Admission, Verdict) {
    let (admission, _, verdict) = concluded(config, &host(), status, body);
    (admission, verdict)
}

/// Ends `check` as the only member of an exchange answered with `status` and `body`.
pub fn conclude(
    config: &Config,
    worker: &mut Worker,
    host: &FakeProxy,
    admission: &mut Admission,
    status: Option<u32>,
    body: &[u8],
) -> Verdict {
    let reply = decode_callout(status, body, &[admission.rule_count()]);
    let mut verdicts = conclude_exchange(
        config,
        worker,
        host,
        reply,
        vec![Concluding::Check(config, admission)],
    );
    verdicts.pop().flatten().unwrap()
}

/// Whether a new request on `host` would ask the bridge (`Start::Ask`), nothing else
/// deciding it first.
pub fn asks(config: &Config, worker: &mut Worker, host: &FakeProxy) -> bool {
    matches!(
        Admission::default().start(config, worker, host),
        Start::Ask(_)
    )
}

/// A new request on `host` that the worker answers itself, without the bridge: its
/// admission and the reply.
pub fn refused(config: &Config, worker: &mut Worker, host: &FakeProxy) -> (Admission, LocalReply) {
    let mut admission = Admission::default();
    let Start::Decided(Verdict::Reply(reply)) = admission.start(config, worker, host) else {
        panic!("not answered locally")
    };
    (admission, reply)
}

/// The rate-limit headers an allowed request's response gets (none: empty).
pub fn shown_headers(admission: &Admission) -> Vec<(&'static str, String)> {
    admission
        .response_headers
        .as_ref()
        .map(RateLimitFields::pairs)
        .unwrap_or_default()
}

/// The value of a local reply's header `name`, which it must have.
pub fn header<'a>(reply: &'a LocalReply, name: &str) -> &'a str {
    reply
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

/// Runs a property over `cases` cases drawn from a fixed seed: the same cases every run, a
/// failing one shrunk and reported, nothing written to disk.
pub fn check<S: proptest::strategy::Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    if let Err(failure) = TestRunner::new_with_rng(config, rng).run(&strategy, test) {
        panic!("{failure}");
    }
}

/// One message of AWS's event stream (Bedrock's `ConverseStream`): an `:event-type`, a
/// `:content-type` and a `:message-type` header (strings), `payload`, and both CRC-32s.
pub fn aws_message(event: &str, payload: &str) -> Vec<u8> {
    let mut headers = Vec::new();
    for (name, value) in [
        (":event-type", event),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ] {
        headers.push(name.len() as u8);
        headers.extend_from_slice(name.as_bytes());
        headers.push(7);
        headers.extend_from_slice(&(value.len() as u16).to_be_bytes());
        headers.extend_from_slice(value.as_bytes());
    }
    let total = 12 + headers.len() + payload.len() + 4;
    let mut m = Vec::new();
    m.extend_from_slice(&(total as u32).to_be_bytes());
    m.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    m.extend_from_slice(&crc32fast::hash(&m).to_be_bytes());
    m.extend_from_slice(&headers);
    m.extend_from_slice(payload.as_bytes());
    m.extend_from_slice(&crc32fast::hash(&m).to_be_bytes());
    m
}
