//! Group commit (`backend.max_inflight`, on by default): past the in-flight limit checks
//! wait, and leave together in one exchange the moment an exchange comes back, sent by the
//! root; each is still answered on its own. Both transports.

use crate::common::{boot, bridge, paused, NOW_MS};
use std::time::Duration;
use wasmtime_harness::{Action, CallResponse, Host};

fn config(transport: &str, failure_mode: &str) -> String {
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
    let sent = |h: &Host| {
        h.callouts().len()
            + h.grpc_streams()
                .iter()
                .map(|s| s.messages.len())
                .sum::<usize>()
    };
    let before = sent(host);
    let (id, action) = host.request("GET", "/", &[("x-user-id", user)]).unwrap();
    assert_eq!(action, Action::Pause);
    assert_eq!(sent(host), before, "nothing sent for {user}");
    id
}

fn line(user: &str) -> String {
    format!("rl:r:{user},10,1,6000,1\n")
}

#[test]
fn http_waiting_checks_leave_together_from_the_root_and_chain_without_a_timer() {
    let mut host = boot(&config("http", "closed"));
    let root = host.callouts().len(); // none yet
    let (a, own) = paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
    assert_eq!(
        host.callout_of(a).unwrap().context_id,
        a,
        "idle: a's own callout"
    );
    let b = waiting(&mut host, "b");
    let c = waiting(&mut host, "c");
    host.answer(own, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(a).unwrap().resumed());
    // a's context cannot carry a batch (it may end before the reply): the root is woken.
    assert_eq!(host.callouts().len(), root + 1);
    host.advance(Duration::from_millis(1)).unwrap();
    let batch = host.callouts().last().unwrap().clone();
    assert_ne!(batch.context_id, b, "sent by the root");
    assert_eq!(batch.body_text(), format!("{}{}", line("b"), line("c")));
    // While the root's batch is out, d and e wait; its reply sends them at once, no tick.
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
    let next = host.callouts().last().unwrap().clone();
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
fn a_request_that_leaves_while_waiting_is_not_sent_and_one_that_leaves_frees_its_slot() {
    let mut host = boot(&config("http", "closed"));
    let (a, _) = paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
    let gone = waiting(&mut host, "gone");
    let stays = waiting(&mut host, "stays");
    host.finish_stream(gone).unwrap();
    // a leaves with its callout out: the slot is free again and the root sends the rest.
    host.finish_stream(a).unwrap();
    host.advance(Duration::from_millis(1)).unwrap();
    let batch = host.callouts().last().unwrap().clone();
    assert_eq!(batch.body_text(), line("stays"));
    host.answer(batch.token, bridge(&format!("{NOW_MS} 1,9,6000,0")))
        .unwrap();
    assert!(host.stream(stays).unwrap().resumed());
}

#[test]
fn a_failed_batch_fails_every_member_but_counts_once_in_the_breaker() {
    for (mode, expect) in [("closed", Some(503)), ("open", None)] {
        let mut host = boot(&config("http", mode));
        let (_, own) = paused(&mut host, "GET", "/", &[("x-user-id", "a")]);
        // Five failures open the breaker; a batch of six failing is one.
        let members: Vec<u32> = (0..6)
            .map(|i| waiting(&mut host, &format!("m{i}")))
            .collect();
        host.answer(own, bridge(&format!("{NOW_MS} 1,9,6000,0")))
            .unwrap();
        host.advance(Duration::from_millis(1)).unwrap();
        let batch = host.callouts().last().unwrap().clone();
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
    let mut host = boot(&config("grpc", "closed"));
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
