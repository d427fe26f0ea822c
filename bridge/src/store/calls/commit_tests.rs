use super::*;
use crate::store::check::{RuleOutcome, RuleSpec};

/// A node that answers each rule `k<n>` with `remaining` n, once the test lets a call
/// through (`gate`), and records the parts of every call.
#[derive(Clone)]
struct Fake {
    calls: Arc<Mutex<Vec<usize>>>,
    gate: Arc<Semaphore>,
}

impl Caller for Fake {
    async fn call(
        &self,
        _node: &Arc<str>,
        _mode: Mode,
        parts: Vec<Check>,
        _queued: usize,
    ) -> Vec<PartReply> {
        self.calls.lock().unwrap().push(parts.len());
        let _pass = self.gate.acquire().await.unwrap();
        parts
            .iter()
            .map(|p| {
                let rules = p
                    .iter()
                    .map(|r| {
                        Some(RuleOutcome {
                            allowed: true,
                            remaining: r.key[1..].parse().unwrap(),
                            ..RuleOutcome::default()
                        })
                    })
                    .collect();
                Ok((1, rules))
            })
            .collect()
    }
}

impl Default for Fake {
    fn default() -> Fake {
        Fake {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Fake {
    fn calls(&self) -> Vec<usize> {
        self.calls.lock().unwrap().clone()
    }
}

/// One rule, `k<n>`; all of the same shape.
fn part(n: u64) -> Check {
    vec![RuleSpec::plain(format!("k{n}"), 100, 1, 1, 1)]
}

fn remaining(replies: &[PartReply]) -> Vec<u64> {
    replies
        .iter()
        .map(|r| r.as_ref().unwrap().1[0].unwrap().remaining)
        .collect()
}

async fn let_tasks_run() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn checks_arriving_while_calls_are_out_leave_together_in_the_next_call() {
    let fake = Fake::default();
    let lanes = Arc::new(Lanes::new(fake.clone(), Duration::from_secs(60), 2));
    let node: Arc<str> = Arc::from("n");
    let submit = |burst: u64| {
        let (lanes, node) = (lanes.clone(), node.clone());
        tokio::spawn(async move { lanes.submit(&node, Mode::Check, vec![part(burst)]).await })
    };
    // The first two fill the calls in flight; the next eight wait for one of them.
    let mut waiting = vec![submit(1)];
    let_tasks_run().await;
    waiting.push(submit(2));
    let_tasks_run().await;
    waiting.extend((3..=10).map(submit));
    let_tasks_run().await;
    assert_eq!(fake.calls(), [1, 1], "two calls in flight, the rest queued");
    assert_eq!(lanes.depth("n"), 8);
    fake.gate.add_permits(100);
    let mut answers = Vec::new();
    for w in waiting {
        answers.push(remaining(&w.await.unwrap()));
    }
    assert_eq!(
        fake.calls(),
        [1, 1, 8],
        "one call for everything that waited"
    );
    let expected: Vec<Vec<u64>> = (1..=10).map(|b| vec![b]).collect();
    assert_eq!(
        answers, expected,
        "each exchange gets its own parts' answers"
    );
    assert_eq!(lanes.depth("n"), 0);
}

#[tokio::test]
async fn an_idle_lane_sends_each_check_at_once() {
    let fake = Fake::default();
    fake.gate.add_permits(100);
    let lanes = Lanes::new(fake.clone(), Duration::from_secs(60), 2);
    let node: Arc<str> = Arc::from("n");
    for burst in 1..=3 {
        let replies = lanes
            .submit(&node, Mode::Check, vec![part(burst), part(10 + burst)])
            .await;
        assert_eq!(remaining(&replies), [burst, 10 + burst]);
    }
    assert_eq!(fake.calls(), [2, 2, 2]);
}

#[tokio::test]
async fn a_call_never_grows_past_its_bounds() {
    let fake = Fake::default();
    let lanes = Arc::new(Lanes::new(fake.clone(), Duration::from_secs(60), 2));
    let node: Arc<str> = Arc::from("n");
    // Two calls in flight, then 600 jobs of two one-key parts each queue: 1,200 keys
    // and parts, over one call's 1,024.
    let mut waiting = Vec::new();
    for i in 0..602u64 {
        let (lanes, node) = (lanes.clone(), node.clone());
        let parts = vec![part(2 * i + 1), part(2 * i + 2)];
        waiting.push(tokio::spawn(async move {
            lanes.submit(&node, Mode::Check, parts).await
        }));
        if i < 2 {
            let_tasks_run().await;
        }
    }
    let_tasks_run().await;
    fake.gate.add_permits(10_000);
    for w in waiting {
        assert!(w.await.unwrap().iter().all(Result::is_ok));
    }
    let calls = fake.calls();
    assert_eq!(calls[..2], [2, 2]);
    assert_eq!(calls[2..], [MAX_KEYS_PER_CALL, 1200 - MAX_KEYS_PER_CALL]);
}

#[tokio::test]
async fn a_check_that_waited_too_long_fails_without_being_sent() {
    let fake = Fake::default();
    let lanes = Arc::new(Lanes::new(fake.clone(), Duration::from_millis(50), 2));
    let node: Arc<str> = Arc::from("n");
    let mut waiting = Vec::new();
    for burst in 1..=3 {
        let (lanes, node) = (lanes.clone(), node.clone());
        waiting.push(tokio::spawn(async move {
            lanes.submit(&node, Mode::Check, vec![part(burst)]).await
        }));
        let_tasks_run().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.gate.add_permits(10);
    let third = waiting.pop().unwrap().await.unwrap();
    let reason = third[0].as_ref().unwrap_err().reason().to_string();
    assert!(reason.contains("waited over"), "{reason}");
    for w in waiting {
        assert!(w.await.unwrap()[0].is_ok());
    }
    assert_eq!(fake.calls(), [1, 1], "the third was never sent");
}
