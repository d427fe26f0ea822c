use super::*;

fn rendered(m: &Metrics) -> String {
    m.render().unwrap()
}

#[test]
fn every_outcome_transport_and_failure_kind_reads_zero_from_the_start() {
    let text = rendered(&Metrics::new());
    for line in [
        "ratelimit_bridge_checks_total{outcome=\"allowed\"} 0",
        "ratelimit_bridge_checks_total{outcome=\"refused\"} 0",
        "ratelimit_bridge_exchanges_total{transport=\"grpc\"} 0",
        "ratelimit_bridge_failures_total{kind=\"over_capacity\"} 0",
        "ratelimit_bridge_connections 0",
        "ratelimit_bridge_batch_checks_count 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn a_script_call_counts_per_node_and_mode_and_fills_both_histograms() {
    let m = Metrics::new();
    let ms = Duration::from_millis(3);
    m.script_call("10.0.0.1:6379", "check", 3, 5, ms, Ok(()));
    m.script_call("10.0.0.1:6379", "check", 1, 1, ms, Err("timeout"));
    m.script_call("10.0.0.2:6379", "peek", 8, 8, ms, Ok(()));
    m.check(Outcome::Denied);
    m.exchange(Transport::Http);
    m.failure(Failure::BadMessage);
    m.queue_depth("10.0.0.2:6379", 7);
    let text = rendered(&m);
    for line in [
        "ratelimit_bridge_script_calls_total{node=\"10.0.0.1:6379\",mode=\"check\"} 2",
        "ratelimit_bridge_script_calls_total{node=\"10.0.0.1:6379\",mode=\"peek\"} 0",
        "ratelimit_bridge_script_calls_total{node=\"10.0.0.2:6379\",mode=\"peek\"} 1",
        "ratelimit_bridge_script_call_failures_total{node=\"10.0.0.1:6379\",kind=\"timeout\"} 1",
        "ratelimit_bridge_batch_checks_count 3",
        "ratelimit_bridge_batch_checks_sum 12.0",
        "ratelimit_bridge_batch_checks_bucket{le=\"1.0\"} 1",
        "ratelimit_bridge_batch_checks_bucket{le=\"4.0\"} 2",
        "ratelimit_bridge_batch_checks_bucket{le=\"8.0\"} 3",
        "ratelimit_bridge_batch_rules_sum 14.0",
        "ratelimit_bridge_redis_call_seconds_count{node=\"10.0.0.1:6379\"} 2",
        "ratelimit_bridge_redis_call_seconds_bucket{le=\"0.0025\",node=\"10.0.0.1:6379\"} 0",
        "ratelimit_bridge_redis_call_seconds_bucket{le=\"0.005\",node=\"10.0.0.1:6379\"} 2",
        "ratelimit_bridge_queue_depth{node=\"10.0.0.2:6379\"} 7",
        "ratelimit_bridge_checks_total{outcome=\"denied\"} 1",
        "ratelimit_bridge_exchanges_total{transport=\"http\"} 1",
        "ratelimit_bridge_failures_total{kind=\"bad_message\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[test]
fn open_connections_and_streams_are_counted_until_dropped() {
    let m = Metrics::new();
    let (a, b, s) = (
        m.connection_opened(),
        m.connection_opened(),
        m.stream_opened(),
    );
    assert!(rendered(&m).contains("ratelimit_bridge_connections 2\n"));
    drop(a);
    assert!(rendered(&m).contains("ratelimit_bridge_connections 1\n"));
    drop((b, s));
    let text = rendered(&m);
    assert!(text.contains("ratelimit_bridge_connections 0\n"), "{text}");
    assert!(text.contains("ratelimit_bridge_grpc_streams 0\n"), "{text}");
}

#[test]
fn each_failure_counts_in_its_own_kind() {
    for (i, failure) in Failure::ALL.iter().enumerate() {
        assert_eq!(*failure as usize, i, "{failure:?}");
    }
    let m = Metrics::new();
    m.failure(Failure::OverCapacity);
    let text = rendered(&m);
    assert!(
        text.contains("failures_total{kind=\"over_capacity\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("failures_total{kind=\"unauthorized\"} 0\n"),
        "{text}"
    );
}
