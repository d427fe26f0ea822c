//! The module's own logic through a fake of Envoy's ABI (`fake_envoy`): its hooks as Envoy
//! calls them, the courier and the worker's stream on the main thread, the answers that
//! wake a worker, and what the module answers Envoy at each step. Every test ends with no
//! call Envoy would not have taken.

use crate::fake_envoy::{Gateway, Request};
use ratelimit_filter::wire;
use std::time::{Duration, Instant};

/// Envoy's `FilterHeadersStatus`, as `abi.h` numbers it: what a test expects the module
/// to answer, written here apart from the module's own constants.
const CONTINUE: i32 = 0;
const STOP: i32 = 1;
const STOP_ALL_AND_WATERMARK: i32 = 4;
/// `FilterDataStatus::StopIterationAndBuffer`.
const STOP_AND_BUFFER: i32 = 1;

fn config(failure_mode: &str, timeout_ms: u64) -> String {
    format!(
        r#"{{"backend": {{"cluster": "ratelimit_bridge", "timeout_ms": {timeout_ms}}},
            "failure_mode": "{failure_mode}",
            "identity": {{"user": {{"header": "x-user-id"}}}},
            "rules": [{{"name": "per-user", "key": ["user"],
                        "limit": {{"requests": 100, "per": "1m"}}}}]}}"#
    )
}

fn gateway(failure_mode: &str, timeout_ms: u64) -> Gateway {
    match Gateway::new(&config(failure_mode, timeout_ms)) {
        Some(gateway) => gateway,
        None => unreachable!("the module refused a valid configuration"),
    }
}

fn user(gw: &Gateway, name: &str) -> Request {
    gw.request(&[
        (":method", "GET"),
        (":path", "/api"),
        (":authority", "gw"),
        ("x-user-id", name),
    ])
}

/// The one stream the gateway has open now, and the messages sent on it since the last look.
fn open_stream(gw: &Gateway) -> (u64, Vec<(u32, String)>) {
    let open: Vec<u64> = gw
        .streams()
        .into_iter()
        .filter(|s| !s.1)
        .map(|s| s.0)
        .collect();
    assert_eq!(open.len(), 1, "streams: {:?}", gw.streams());
    (open[0], gw.messages(open[0]))
}

/// User `name`'s request, paused for its check, which the main thread then sends: the
/// request, the one stream open, and the one exchange sent on it (id and batch).
fn checked(gw: &Gateway, name: &str) -> (Request, u64, (u32, String)) {
    let request = user(gw, name);
    // Out: Envoy holds the body and trailers back from every filter meanwhile.
    assert_eq!(request.headers(true), STOP_ALL_AND_WATERMARK);
    gw.main_thread();
    let (stream, mut sent) = open_stream(gw);
    assert_eq!(sent.len(), 1, "one exchange, one check: {sent:?}");
    let exchange = sent.remove(0);
    (request, stream, exchange)
}

fn answered(request: &Request) -> Vec<u32> {
    request.seen(|f| f.answered.iter().map(|a| a.0).collect())
}

fn no_misuse(gw: &Gateway) {
    assert_eq!(gw.misuse(), Vec::<String>::new());
}

#[test]
fn a_check_travels_on_the_workers_stream_and_its_answer_resumes_the_request() {
    let gw = gateway("closed", 1_000);
    let (request, stream, sent) = checked(&gw, "alice");
    let path = format!("/{}/{}", wire::GRPC_SERVICE, wire::GRPC_METHOD);
    let headers = gw.stream_headers(stream);
    assert!(
        headers.contains(&(":path".into(), path.into_bytes())),
        "{headers:?}"
    );
    let (exchange, batch) = &sent;
    assert_eq!(batch.lines().count(), 1);
    gw.answer(stream, *exchange, batch, true, 99);
    assert_eq!(
        request.seen(|f| f.continued),
        0,
        "resumed on its worker, not the main thread"
    );
    gw.worker();
    assert_eq!(request.seen(|f| f.continued), 1);
    assert_eq!(request.response("200"), CONTINUE);
    assert_eq!(
        request.response_header("x-ratelimit-remaining").as_deref(),
        Some("99")
    );
    request.destroy();
    assert_eq!(gw.counter("ratelimit.allowed"), 1);
    assert_eq!(gw.counter("ratelimit.stream_messages"), 1);
    no_misuse(&gw);
}

#[test]
fn a_denial_is_answered_429_and_the_next_request_is_denied_without_an_exchange() {
    let gw = gateway("closed", 1_000);
    let (first, stream, sent) = checked(&gw, "bob");
    gw.answer(stream, sent.0, &sent.1, false, 0);
    gw.worker();
    assert_eq!(answered(&first), vec![429]);
    let retry = first.seen(|f| {
        let headers = &f.answered[0].1;
        headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("retry-after") && v == b"1")
    });
    assert!(retry, "a 429 says when to come back");
    assert_eq!(first.seen(|f| f.continued), 0);
    first.destroy();
    // The deny cache answers the same user at once: nothing sent, nothing waits.
    let second = user(&gw, "bob");
    assert_eq!(second.headers(true), STOP);
    assert_eq!(answered(&second), vec![429]);
    gw.main_thread();
    assert!(gw.messages(stream).is_empty());
    second.destroy();
    assert_eq!(gw.counter("ratelimit.denied"), 1);
    assert_eq!(gw.counter("ratelimit.denied_cached"), 1);
    no_misuse(&gw);
}

#[test]
fn a_stream_reset_fails_what_it_carried_per_the_failure_mode_and_the_next_check_opens_another() {
    let gw = gateway("closed", 1_000);
    let (first, stream, _) = checked(&gw, "carol");
    gw.reset(stream);
    gw.worker();
    assert_eq!(
        answered(&first),
        vec![503],
        "closed: a check the stream lost fails"
    );
    first.destroy();
    // The dispatcher opens another stream at once; the next check travels on it.
    let (second, again, sent) = checked(&gw, "carol");
    assert_ne!(again, stream);
    gw.answer(again, sent.0, &sent.1, true, 98);
    gw.worker();
    assert_eq!(second.seen(|f| f.continued), 1);
    second.destroy();
    assert_eq!(gw.counter("ratelimit.backend_failures"), 1);
    no_misuse(&gw);
}

#[test]
fn a_stream_that_never_opens_fails_its_check_per_the_failure_mode() {
    let gw = gateway("open", 1_000);
    gw.refuse_streams();
    let request = user(&gw, "dave");
    assert_eq!(request.headers(true), STOP_ALL_AND_WATERMARK);
    gw.main_thread();
    assert!(gw.streams().is_empty());
    gw.worker();
    // Open: let through, unchecked.
    assert_eq!(request.seen(|f| f.continued), 1);
    assert!(answered(&request).is_empty());
    request.destroy();
    no_misuse(&gw);
}

#[test]
fn a_message_unanswered_within_timeout_ms_fails_at_the_tick() {
    let gw = gateway("closed", 40);
    let (request, stream, sent) = checked(&gw, "erin");
    gw.worker();
    assert!(answered(&request).is_empty(), "failed before timeout_ms");
    // The ticker thread asks the main thread for a tick every 10 ms (timeout_ms / 4); the
    // tick past timeout_ms fails the exchange. Generous, for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered(&request).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        gw.main_thread();
        gw.worker();
    }
    assert_eq!(answered(&request), vec![503]);
    // A late answer finds nothing to decide.
    gw.answer(stream, sent.0, &sent.1, true, 1);
    gw.worker();
    assert_eq!(request.seen(|f| f.continued), 0);
    request.destroy();
    no_misuse(&gw);
}

#[test]
fn a_request_gone_while_its_check_is_out_is_never_touched_again() {
    let gw = gateway("closed", 1_000);
    let (gone, stream, sent) = checked(&gw, "frank");
    gone.destroy();
    gw.answer(stream, sent.0, &sent.1, true, 1);
    gw.worker();
    // The next request's turn takes in the answer, whose request is gone.
    let next = user(&gw, "grace");
    assert_eq!(next.headers(true), STOP_ALL_AND_WATERMARK);
    assert_eq!(gone.seen(|f| (f.continued, f.answered.len())), (0, 0));
    next.destroy();
    no_misuse(&gw);
}

#[test]
fn a_request_no_rule_covers_goes_on_at_once_and_sends_nothing() {
    let gw = gateway("closed", 1_000);
    let request = gw.request(&[(":method", "GET"), (":path", "/"), (":authority", "gw")]);
    assert_eq!(request.headers(true), CONTINUE);
    assert_eq!(request.response("200"), CONTINUE);
    request.destroy();
    gw.main_thread();
    assert!(gw.streams().is_empty());
    no_misuse(&gw);
}

#[test]
fn a_configuration_the_loader_refuses_is_refused() {
    assert!(Gateway::new("{}").is_none());
    assert!(Gateway::new("not json").is_none());
    let unknown = config("closed", 1_000).replace("\"failure_mode\"", "\"failure_mod\"");
    assert!(Gateway::new(&unknown).is_none());
}

#[test]
fn a_check_on_the_body_holds_the_body_until_its_end_then_waits_for_its_answer() {
    let json = r#"{"backend": {"cluster": "ratelimit_bridge"},
        "identity": {"api_key": {"header": "x-api-key"}},
        "rules": [{"name": "tokens", "key": ["api_key"],
                   "limit": {"requests": 10000, "per": "30d"},
                   "meter": {"body": {"usage.total_tokens": 1},
                             "reserve": {"body": ["max_tokens"], "default": 100,
                                         "max": 2000}}}]}"#;
    let Some(gw) = Gateway::new(json) else {
        unreachable!("the module refused a valid configuration");
    };
    let request = gw.request(&[
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
        ("x-api-key", "k1"),
    ]);
    // Stopped alone, so that its body comes to the filter, which holds it to its end.
    assert_eq!(request.headers(false), STOP);
    assert_eq!(request.body(br#"{"max_tokens": "#, false), STOP_AND_BUFFER);
    gw.main_thread();
    assert!(
        gw.streams().is_empty(),
        "nothing leaves before the body has ended"
    );
    assert_eq!(request.body(b"640}", true), STOP_AND_BUFFER);
    gw.main_thread();
    let (stream, sent) = open_stream(&gw);
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].1.contains("640"),
        "the check reserves what the body asked: {}",
        sent[0].1
    );
    gw.answer(stream, sent[0].0, &sent[0].1, true, 9_360);
    gw.worker();
    assert_eq!(request.seen(|f| f.continued), 1);
    request.destroy();
    no_misuse(&gw);
}

#[test]
fn a_repeated_identity_header_is_refused_not_read_as_its_first_value() {
    let gw = gateway("closed", 1_000);
    let request = gw.request(&[
        (":method", "GET"),
        (":path", "/api"),
        (":authority", "gw"),
        ("x-user-id", "victim"),
        ("x-user-id", "attacker"),
    ]);
    assert_eq!(request.headers(true), STOP);
    assert_eq!(answered(&request), vec![400]);
    gw.main_thread();
    assert!(gw.streams().is_empty(), "nothing checked for either value");
    request.destroy();
    assert_eq!(gw.counter("ratelimit.rejected"), 1);
    no_misuse(&gw);
}
