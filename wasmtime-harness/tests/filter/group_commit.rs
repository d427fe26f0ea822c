//! Group commit (`backend.max_inflight`, on by default): past the in-flight limit checks
//! wait, and leave together in one exchange the moment an exchange comes back; each is
//! still answered on its own. Both transports; over HTTP the root sends every callout,
//! woken by a post to its shared queue.

use crate::common::{boot, bridge, NOW_MS};
use wasmtime_harness::{Action, CallResponse, Host};

/// One rule (ten a minute) on a bridge over `transport` that is sent one exchange at a
/// time (`max_inflight` 1) and given 25 ms.
fn one_in_flight(transport: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"backend": {{"cluster": "ratelimit_bridge", "timeout_ms": 25, "max_inflight": 1,
                          "transport": "{transport}"}},
            "failure_mode": "{failure_mode}",
            "identity": {{"user": {{"header": "x-user-id"}}}},
            "rules": [{{"name": "r", "key": ["user"], "limit": {{"requests": 10, "per": "1m"}}}}]}}"#
    )
}

/// A request that waits: paused, and nothing sent for it.
fn waiting(host: &mut Host, user: &str) -> u32 {
    let sent = |h: &Host| h.callouts().len() + h.grpc_messages_sent();
    let before = sent(host);
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    assert_eq!(action, Action::Pause);
    assert_eq!(sent(host), before, "nothing sent for {user}");
    id
}

fn line(user: &str) -> String {
    format!("rl:r:{user},10,1,6000,1\n")
}

/// The callout the root sent last (over HTTP, with group commit, the root sends them all).
fn last_callout(host: &Host) -> wasmtime_harness::Callout {
    host.callouts().last().expect("a callout").clone()
}

#[test]
fn http_checks_are_sent_by_the_root_and_waiting_ones_leave_when_a_reply_arrives() {
    let mut host = boot(&one_in_flight("http", "closed"));
    let (a, action) = host.request("GET", "/", &[("x-user-id", "a")]).unwrap();
    assert_eq!(action, Action::Pause);
    // a's request woke the root through its queue; the root sent the callout.
    let first = last_callout(&host);
    assert_ne!(first.context_id, a, "sent by the root, not by the request");
    assert_eq!(first.body_text(), line("a"));
    let b = waiting(&mut host, "b");
    let c = waiting(&mut host, "c");
    host.answer(first.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(a).unwrap().resumed());
    // The reply sends what waited at once: no tick, no timer.
    let batch = last_callout(&host);
    assert_eq!(batch.body_text(), format!("{}{}", line("b"), line("c")));
    let d = waiting(&mut host, "d");
    let e = waiting(&mut host, "e");
    let reply = format!("{NOW_MS} 1,8,6000,0\n{NOW_MS} 0,0,6000,6000");
    host.answer(batch.token, bridge(&reply)).unwrap();
    assert!(host.stream(b).unwrap().resumed(), "{}", host.log_text());
    let denied = host.stream(c).unwrap().local_reply().unwrap().clone();
    assert_eq!(
        (denied.status, denied.header("retry-after").as_deref()),
        (429, Some("6"))
    );
    let next = last_callout(&host);
    assert_eq!(next.body_text(), format!("{}{}", line("d"), line("e")));
    let reply = format!("{NOW_MS} 1,7,6000,0\n{NOW_MS} 1,6,6000,0");
    host.answer(next.token, bridge(&reply)).unwrap();
    assert!(host.stream(d).unwrap().resumed() && host.stream(e).unwrap().resumed());
    // b's response carries its own numbers.
    host.response_headers(b, &[(":status", "200")], true)
        .unwrap();
    let headers = &host.stream(b).unwrap().response_headers;
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == b"x-ratelimit-remaining" && v == b"8"),
        "{headers:?}"
    );
}

#[test]
fn requests_that_leave_are_not_sent_and_their_answers_find_no_one() {
    let mut host = boot(&one_in_flight("http", "closed"));
    let a = host.request("GET", "/", &[("x-user-id", "a")]).unwrap().0;
    let first = last_callout(&host);
    let gone = waiting(&mut host, "gone");
    let stays = waiting(&mut host, "stays");
    host.finish_stream(gone).unwrap();
    host.finish_stream(a).unwrap();
    host.answer(first.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    let batch = last_callout(&host);
    assert_eq!(batch.body_text(), line("stays"));
    host.answer(batch.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(stays).unwrap().resumed());
}

#[test]
fn a_failed_batch_fails_every_member_but_counts_once_in_the_breaker() {
    for (mode, expect) in [("closed", Some(503)), ("open", None)] {
        let mut host = boot(&one_in_flight("http", mode));
        host.request("GET", "/", &[("x-user-id", "a")]).unwrap();
        let first = last_callout(&host);
        // Five failures open the breaker; a batch of six failing is one.
        let members: Vec<u32> = (0..6)
            .map(|i| waiting(&mut host, &format!("m{i}")))
            .collect();
        host.answer(first.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
            .unwrap();
        let batch = last_callout(&host);
        host.answer(batch.token, CallResponse::new(200, "garbage"))
            .unwrap();
        for &id in &members {
            let stream = host.stream(id).unwrap();
            assert_eq!(stream.local_reply().map(|r| r.status), expect, "{mode}");
            assert_eq!(stream.resumed(), expect.is_none(), "{mode}");
        }
        let before = host.callouts().len();
        let (_, action) = host.request("GET", "/", &[("x-user-id", "next")]).unwrap();
        assert_eq!(action, Action::Pause, "breaker still closed ({mode})");
        assert_eq!(host.callouts().len(), before + 1, "{}", host.log_text());
    }
}

#[test]
fn stream_checks_past_the_limit_leave_together_when_a_reply_arrives() {
    let mut host = boot(&one_in_flight("grpc", "closed"));
    let token = host.grpc_streams()[0].token;
    let a = host.request("GET", "/", &[("x-user-id", "a")]).unwrap().0;
    assert_eq!(
        host.grpc_streams()[0].messages_text(),
        [format!("1\n{}", line("a"))]
    );
    let b = waiting(&mut host, "b");
    let c = waiting(&mut host, "c");
    host.grpc_message(token, format!("1\n{NOW_MS} 1,9,6000,0\n").as_bytes())
        .unwrap();
    assert!(host.stream(a).unwrap().resumed(), "{}", host.log_text());
    let sent = host.grpc_streams()[0].messages_text();
    assert_eq!(sent.len(), 2, "sent at once, no tick");
    assert_eq!(sent[1], format!("2\n{}{}", line("b"), line("c")));
    host.grpc_message(
        token,
        format!("2\n{NOW_MS} 1,8,6000,0\n{NOW_MS} 0,0,6000,600\n").as_bytes(),
    )
    .unwrap();
    assert!(host.stream(b).unwrap().resumed());
    assert_eq!(host.stream(c).unwrap().local_reply().unwrap().status, 429);
}
