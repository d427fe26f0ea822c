//! What a client reads of its own quota at the `quota_api` path (docs/quota-api.md): every
//! rule that applies to it, as its gateway's check answered, in JSON. Its rules are those
//! its own identities key: nothing in the request names another client.

use crate::decision::response::LocalReply;
use crate::request::rules::PlannedRule;
use crate::wire::RuleResult;
use ratelimit_config::config::Config;
use serde_json::{json, Map, Value};

/// The answer to a quota request, `rules` each with what its check answered at Redis time
/// `now_ms`, in the configuration's order.
pub fn answer(config: &Config, now_ms: u64, rules: &[(&PlannedRule, &RuleResult)]) -> LocalReply {
    let mut ordered: Vec<&(&PlannedRule, &RuleResult)> = rules.iter().collect();
    ordered.sort_by_key(|(p, _)| p.rule);
    let shown: Vec<Value> = ordered
        .into_iter()
        .map(|(p, r)| rule(config, now_ms, p, r))
        .collect();
    let body = json!({ "rules": shown }).to_string();
    LocalReply {
        status: 200,
        headers: vec![
            ("content-type", "application/json".into()),
            ("cache-control", "no-store".into()),
        ],
        body,
    }
}

/// One rule as the client reads it: an in-flight rule's most and slots left; a rate rule's
/// limit (the burst of the client's tier), tokens left, when the bucket is full again
/// (Unix seconds) and its window (seconds; a calendar quota's `period` and `time_zone`
/// instead, `reset` being the period's end), as its `X-RateLimit-*` headers say; and, when
/// what is left cannot pay a request, the seconds until it can (`retry_after`).
fn rule(config: &Config, now_ms: u64, p: &PlannedRule, r: &RuleResult) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), config.rule_name(p.rule).into());
    if p.slot.is_some() {
        out.insert("in_flight".into(), p.limit.burst.into());
        out.insert("remaining".into(), r.remaining.into());
    } else {
        // The client's plan's when the bridge put one on the rule.
        out.insert("limit".into(), r.in_force(p.limit.burst).into());
        out.insert("remaining".into(), r.remaining.into());
        let reset = now_ms.saturating_add(r.full_ms).div_ceil(1000);
        out.insert("reset".into(), reset.into());
        match config.rules.get(p.rule).and_then(|c| c.calendar(&p.limit)) {
            // A calendar quota's window is its period, whose length varies: named, with
            // the time zone it starts in.
            Some((_, zone)) => {
                out.insert("period".into(), p.limit.period_phrase().into());
                out.insert("time_zone".into(), zone.into());
            }
            None => {
                out.insert("window".into(), p.limit.window_s().into());
            }
        }
    }
    if r.wait_ms > 0 {
        out.insert("retry_after".into(), r.wait_ms.div_ceil(1000).into());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::planned;
    use ratelimit_protocol::slot::Slot;

    #[test]
    fn each_rule_reads_as_its_headers_would_say_in_config_order() {
        let json = r#"{"backend": {"cluster": "b"}, "rules": [
            {"name": "streams", "in_flight": {"max": 4}},
            {"name": "per-user", "limit": {"requests": 100, "per": "1m"}}]}"#;
        let Ok(config) = Config::parse(json.as_bytes()) else {
            unreachable!("a valid configuration")
        };
        let per_user = PlannedRule {
            rule: 1,
            limit: config.rules[1].limit,
            ..planned("rl:per-user:a", 100, 1, 600, 0)
        };
        let streams = PlannedRule {
            slot: Some(Slot {
                ttl_ms: 30_000,
                id: "look".into(),
            }),
            ..planned("rl:streams:a", 4, 1, 7_500, 0)
        };
        let left = RuleResult {
            remaining: 0,
            full_ms: 60_000,
            wait_ms: 1_500,
            ..RuleResult::default()
        };
        let slots = RuleResult {
            remaining: 3,
            ..RuleResult::default()
        };
        let reply = answer(
            &config,
            1_000_000,
            &[(&per_user, &left), (&streams, &slots)],
        );
        assert_eq!(reply.status, 200);
        let Ok(body) = serde_json::from_str::<Value>(&reply.body) else {
            unreachable!("{}", reply.body)
        };
        assert_eq!(
            body,
            json!({"rules": [
                {"name": "streams", "in_flight": 4, "remaining": 3},
                {"name": "per-user", "limit": 100, "remaining": 0, "reset": 1_060,
                 "window": 60, "retry_after": 2}
            ]})
        );
    }
}
