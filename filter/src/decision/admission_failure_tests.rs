//! A check the backend does not answer: the failure mode (open, closed, local), the
//! circuit breaker counting each failed exchange once, and the refused checks it never
//! blames the backend for.

use super::*;
use crate::fakes::{
    asks, conclude, example, finish, header, host, shown_headers, started, EXAMPLE,
};

const FAILURES: &[(Option<u32>, &[u8])] = &[
    (None, b""),
    (Some(503), b"upstream connect error"),
    (Some(200), b"garbage"),
    (Some(200), b"1700000000000 1,97,1800,0"),
    (Some(200), b"! redis unavailable\n"),
];

#[test]
fn failures_follow_the_failure_mode() {
    for &(status, body) in FAILURES {
        let (admission, verdict) = finish(&example("closed"), status, body);
        let Verdict::Reply(r) = verdict else {
            panic!("closed let it through")
        };
        assert_eq!(r.status, 503);
        assert_eq!(header(&r, "retry-after"), "1");
        assert_eq!(admission.outcome, Some(Outcome::BackendFailed));

        let (admission, verdict) = finish(&example("open"), status, body);
        assert_eq!(verdict, Verdict::Resume);
        assert!(shown_headers(&admission).is_empty());
    }
}

#[test]
fn local_failure_mode_enforces_the_share_with_shared_buckets() {
    let json = EXAMPLE.replace(
        r#""failure_mode": "closed""#,
        r#""failure_mode": "local", "local_share": 0.5"#,
    );
    let c = Config::parse(json.as_bytes()).unwrap();
    let host = host();
    let mut worker = Worker::new(&c);
    let mut verdicts = Vec::new();
    for _ in 0..8 {
        let mut admission = Admission::default();
        let verdict = match admission.start(&c, &mut worker, &host) {
            Start::Ask(_) => conclude(&c, &mut worker, &host, &mut admission, None, b""),
            Start::Decided(v) => v,
            Start::Skip | Start::ReadBody => panic!("rules apply, none reading the body"),
        };
        verdicts.push(verdict);
    }
    // search-per-ip has a burst of 10: half of it locally.
    let allowed = verdicts.iter().filter(|v| **v == Verdict::Resume).count();
    assert_eq!(allowed, 5);
    let Verdict::Reply(r) = &verdicts[5] else {
        panic!("sixth admitted")
    };
    assert_eq!((r.status, header(r, "x-ratelimit-limit")), (429, "10"));
}

#[test]
fn an_open_breaker_skips_the_callout_until_a_probe_succeeds() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    for _ in 0..c.circuit_breaker.failures {
        let mut admission = Admission::default();
        assert!(matches!(
            admission.start(&c, &mut worker, &host),
            Start::Ask(_)
        ));
        conclude(&c, &mut worker, &host, &mut admission, None, b"");
    }
    let mut admission = Admission::default();
    let Start::Decided(Verdict::Reply(r)) = admission.start(&c, &mut worker, &host) else {
        panic!("breaker not open")
    };
    assert_eq!(r.status, 503);
    assert_eq!(admission.outcome, Some(Outcome::ShortCircuited));
    host.now.set(host.now.get() + c.circuit_breaker.open_ms);
    let mut probe = Admission::default();
    assert!(matches!(probe.start(&c, &mut worker, &host), Start::Ask(_)));
    conclude(
        &c,
        &mut worker,
        &host,
        &mut probe,
        Some(200),
        b"1 1,1,1,0 1,1,1,0 1,1,1,0",
    );
    assert!(!worker.breaker.is_open());
}

#[test]
fn a_failed_exchange_counts_once_in_the_breaker_however_many_checks_it_carried() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    let mut admissions: Vec<Admission> = (0..2 * c.circuit_breaker.failures)
        .map(|_| started(&c, &host).0)
        .collect();
    let members = admissions
        .iter_mut()
        .map(|admission| Concluding::Check(&c, admission))
        .collect();
    let verdicts = conclude_exchange(&c, &mut worker, &host, Err("reset".into()), members);
    assert!(verdicts
        .iter()
        .all(|v| matches!(v, Some(Verdict::Reply(r)) if r.status == 503)));
    assert!(
        !worker.breaker.is_open(),
        "one failure, not {}",
        admissions.len()
    );
    // A line the bridge could not run fails its own check only; a departed member gets
    // no verdict.
    let (mut ok, mut failed) = (started(&c, &host).0, started(&c, &host).0);
    let body = b"1 1,1,1,0 1,1,1,0 1,1,1,0\n! redis down\n1 1,1,1,0 1,1,1,0 1,1,1,0\n";
    let reply = decode_callout(Some(200), body, &[3, 3, 3]);
    let members = vec![
        Concluding::Check(&c, &mut ok),
        Concluding::Check(&c, &mut failed),
        Concluding::Nothing,
    ];
    let verdicts = conclude_exchange(&c, &mut worker, &host, reply, members);
    assert_eq!(verdicts[0], Some(Verdict::Resume));
    assert!(matches!(&verdicts[1], Some(Verdict::Reply(r)) if r.status == 503));
    assert_eq!(verdicts[2], None);
    assert_eq!(
        (ok.outcome, failed.outcome),
        (Some(Outcome::Allowed), Some(Outcome::BackendFailed))
    );
}

#[test]
fn refused_checks_get_the_failure_mode_but_never_open_the_breaker() {
    let c = example("closed");
    let host = host();
    let mut worker = Worker::new(&c);
    for _ in 0..3 * c.circuit_breaker.failures {
        let mut admission = started(&c, &host).0;
        let verdict = conclude(
            &c,
            &mut worker,
            &host,
            &mut admission,
            Some(200),
            b"? key outside the allowed prefixes\n",
        );
        assert!(matches!(verdict, Verdict::Reply(r) if r.status == 503));
        assert_eq!(admission.outcome, Some(Outcome::Refused));
    }
    assert!(!worker.breaker.is_open());
    assert!(asks(&c, &mut worker, &host));
}
