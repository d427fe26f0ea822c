//! What the client sees: rate-limit headers, the 429 reply, the failure-mode 503.

use crate::decision::ietf;
pub use crate::decision::shown::Shown;
use crate::metering::MAX_TEXT_LEN;
use crate::request::identity::{self, BadIdentity};
use ratelimit_config::config::Config;
use ratelimit_protocol::u64_digits;

/// A reply the filter sends itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// The rate-limit fields of a response, kept as numbers until they are written: an allowed
/// response's fields are written straight from them, without an allocation per field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitFields {
    limit: u64,
    remaining: u64,
    reset_unix_s: u64,
    /// `RateLimit-Policy` and `RateLimit`, with `headers.ietf_draft`.
    ietf: Option<(String, String)>,
}

impl RateLimitFields {
    /// `X-RateLimit-*` (and, if configured, the IETF draft fields) for the shown rule.
    pub fn of(shown: &Shown<'_>, config: &Config) -> RateLimitFields {
        RateLimitFields {
            limit: shown.in_force(),
            remaining: shown.result.remaining,
            // Both come from the bridge: saturate rather than trust them not to overflow.
            reset_unix_s: shown
                .now_ms
                .saturating_add(shown.result.full_ms)
                .div_ceil(1000),
            ietf: config.headers.ietf_draft.then(|| {
                (
                    ietf::policy_field(shown, config),
                    ietf::service_limit_field(shown, config),
                )
            }),
        }
    }

    /// Hands each field's name and value to `add`, in order.
    pub fn each(&self, mut add: impl FnMut(&'static str, &[u8])) {
        let mut digits = [0; 20];
        add("x-ratelimit-limit", u64_digits(&mut digits, self.limit));
        add(
            "x-ratelimit-remaining",
            u64_digits(&mut digits, self.remaining),
        );
        add(
            "x-ratelimit-reset",
            u64_digits(&mut digits, self.reset_unix_s),
        );
        if let Some((policy, service_limit)) = &self.ietf {
            add("ratelimit-policy", policy.as_bytes());
            add("ratelimit", service_limit.as_bytes());
        }
    }

    /// The fields as owned pairs (a local reply's headers).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(5);
        self.each(|name, value| pairs.push((name, String::from_utf8_lossy(value).into_owned())));
        pairs
    }
}

/// The 429 for a denied request.
pub fn too_many_requests(shown: &Shown<'_>, config: &Config) -> LocalReply {
    let limit = &shown.rule.limit;
    let sentence = match shown.rule.slot {
        Some(_) => format!(
            "You have {} requests in flight, the most allowed: retry once one has ended.",
            limit.burst
        ),
        None => format!(
            "You have exceeded the rate limit of {} requests per {}.",
            limit.requests,
            limit.period_phrase()
        ),
    };
    let problem = Problem {
        error: "Rate limit exceeded",
        kind: "quota-exceeded",
        title: "Request cannot be satisfied as assigned quota has been exceeded",
    };
    refusal(shown, 429, &problem, &sentence, config)
}

/// The reply to a blocked client: the rule's status, the usual headers, `Retry-After` the
/// rest of the block.
pub fn blocked(shown: &Shown<'_>, status: u32, config: &Config) -> LocalReply {
    let limit = &shown.rule.limit;
    let sentence = format!(
        "Too many of your requests were over the rate limit of {} requests per {}: you are blocked.",
        limit.requests,
        limit.period_phrase()
    );
    let problem = Problem {
        error: "Blocked",
        kind: "abnormal-usage-detected",
        title: "Request not satisfied due to detection of abnormal request pattern",
    };
    refusal(shown, status, &problem, &sentence, config)
}

/// Why a request is refused: our `error`, and the IETF draft's problem type for it.
struct Problem {
    error: &'static str,
    /// The fragment of `https://iana.org/assignments/http-problem-types#...` (draft-11, 5).
    kind: &'static str,
    title: &'static str,
}

/// A refused request's reply: the shown rule's headers, `Retry-After`, and a JSON body of
/// `error` and `message` (none of the texts holds a character JSON would escape). With
/// the IETF fields on, the body is also an RFC 9457 problem of the draft's type, naming the
/// violated policy.
fn refusal(
    shown: &Shown<'_>,
    status: u32,
    problem: &Problem,
    sentence: &str,
    config: &Config,
) -> LocalReply {
    let retry = shown.retry_after_s();
    let mut headers = RateLimitFields::of(shown, config).pairs();
    headers.push(("retry-after", retry.to_string()));
    let plural = if retry == 1 { "" } else { "s" };
    let error = problem.error;
    let mut body = format!(
        "{{\"error\": \"{error}\", \"message\": \"{sentence} Try again in {retry} second{plural}.\""
    );
    if config.headers.ietf_draft {
        headers.push(("content-type", "application/problem+json".into()));
        body.push_str(&format!(
            ", \"type\": \"https://iana.org/assignments/http-problem-types#{}\", \"title\": \"{}\", \"violated-policies\": [\"{}\"]",
            problem.kind,
            problem.title,
            config.rule_name(shown.rule.rule)
        ));
    } else {
        headers.push(("content-type", "application/json".into()));
    }
    body.push('}');
    LocalReply {
        status,
        headers,
        body,
    }
}

/// The fail-closed reply when the limiter cannot decide.
pub fn unavailable() -> LocalReply {
    LocalReply {
        status: 503,
        headers: vec![
            ("retry-after", "1".into()),
            ("content-type", "application/json".into()),
        ],
        body: "{\"error\": \"Rate limiter unavailable\", \"message\": \"The rate limiter could not check this request. Try again in 1 second.\"}".into(),
    }
}

/// The 400 for a request whose identity cannot be told: its `header` came more than once,
/// or holds no readable JWT.
pub fn bad_identity(bad: &BadIdentity) -> LocalReply {
    let problem: String = match bad.problem {
        identity::Problem::Repeated => match bad.at {
            identity::Place::Header(_) => "appears more than once".into(),
            // Go's JSON reader takes a key in any letter case for the field.
            identity::Place::Body(_) => "appears more than once, or in another letter case".into(),
        },
        identity::Problem::Unreadable => "holds no readable JWT".into(),
        identity::Problem::NotAString => format!(
            "holds something other than a string of at most {MAX_TEXT_LEN} bytes (with no \\u \
             escape beyond ASCII)"
        ),
        identity::Problem::BodyUnreadable => "cannot be read: the body is malformed JSON, \
            compressed, not UTF-8, or begins with a byte order mark or a NUL"
            .into(),
    };
    let at = match &bad.at {
        identity::Place::Header(name) => format!("{name} header"),
        identity::Place::Body(path) => format!("field {path:?} of its JSON body"),
    };
    // A body field's name is the operator's to choose: JSON-escaped.
    let message = serde_json::to_string(&format!("The {at} {problem}.")).unwrap_or_default();
    LocalReply {
        status: 400,
        headers: vec![("content-type", "application/json".into())],
        body: format!("{{\"error\": \"Bad request\", \"message\": {message}}}"),
    }
}

/// The refusal of a request that lacks identity `identity`, which rule `rule` needs and
/// will not do without (`"missing": "deny"`): a 429 as the rule's own denial, but with no
/// `Retry-After`, since waiting gives the request no identity.
pub fn missing_identity(config: &Config, rule: usize, identity: usize) -> LocalReply {
    let needed = config.identities.get(identity);
    let message = format!(
        "This request lacks {}, which the rate limit {:?} needs to count it.",
        needed.map_or_else(|| "an identity".into(), |i| i.source.described()),
        config.rule_name(rule),
    );
    // A claim's name is the operator's to choose: JSON-escaped, unlike the other texts.
    let message = serde_json::to_string(&message).unwrap_or_default();
    LocalReply {
        status: 429,
        headers: vec![("content-type", "application/json".into())],
        body: format!("{{\"error\": \"Rate limit key missing\", \"message\": {message}}}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::rules::PlannedRule;
    use crate::wire::RuleResult;

    /// Rules `per-user` (100/min), `global` (5000/s, burst 10000), `fast` (10 per 500 ms)
    /// and `trial` (in shadow mode); `ietf` turns the draft fields on.
    fn four_rules(ietf: bool) -> Config {
        let json = format!(
            r#"{{"backend":{{"cluster":"b"}},"headers":{{"ietf_draft":{ietf}}},"rules":[
                {{"name":"per-user","limit":{{"requests":100,"per":"1m"}}}},
                {{"name":"global","limit":{{"requests":5000,"per":"1s","burst":10000}}}},
                {{"name":"fast","limit":{{"requests":10,"per":"500ms"}}}},
                {{"name":"trial","mode":"shadow","limit":{{"requests":1,"per":"1h"}}}}]}}"#
        );
        Config::parse(json.as_bytes()).unwrap()
    }

    /// Every rule of `config` planned for one request, in order.
    fn every_rule_planned(config: &Config) -> Vec<PlannedRule> {
        (config.rules.iter().enumerate())
            .map(|(i, r)| PlannedRule {
                rule: i,
                key: format!("rl:{}", r.name),
                limit: r.limit,
                cost: 1,
                lease: 0,
                block: None,
                shadow: r.shadow,
                slot: None,
            })
            .collect()
    }

    fn result(allowed: bool, remaining: u64, full_ms: u64, wait_ms: u64) -> RuleResult {
        RuleResult {
            allowed,
            remaining,
            full_ms,
            wait_ms,
            ..RuleResult::default()
        }
    }

    #[test]
    fn denial_renders_the_documented_headers_and_body() {
        let config = four_rules(false);
        let all = every_rule_planned(&config);
        let result = result(false, 0, 59_400, 599);
        let shown = Shown {
            rule: &all[0],
            all: &all[..1],
            result: &result,
            now_ms: 1_640_995_140_600,
        };
        let reply = too_many_requests(&shown, &config);
        assert_eq!(reply.status, 429);
        assert_eq!(
            reply.headers,
            vec![
                ("x-ratelimit-limit", "100".to_string()),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "1640995200".to_string()),
                ("retry-after", "1".to_string()),
                ("content-type", "application/json".to_string()),
            ]
        );
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["error"], "Rate limit exceeded");
        assert_eq!(
            body["message"],
            "You have exceeded the rate limit of 100 requests per minute. Try again in 1 second."
        );
        assert!(body.get("type").is_none(), "{body}");
    }

    #[test]
    fn ietf_draft_fields_are_opt_in() {
        let result = result(true, 7, 1_800, 0);
        let plain_config = four_rules(false);
        let all = every_rule_planned(&plain_config);
        let shown = Shown {
            rule: &all[0],
            all: &all,
            result: &result,
            now_ms: 1_000,
        };
        assert_eq!(RateLimitFields::of(&shown, &plain_config).pairs().len(), 3);
        let draft = RateLimitFields::of(&shown, &four_rules(true)).pairs();
        assert_eq!(draft.len(), 5);
        assert_eq!(
            draft[3],
            (
                "ratelimit-policy",
                "\"per-user\";q=100;w=60, \"global\";q=5000;w=1;burst=10000, \"fast\";q=10"
                    .to_string()
            ),
            "every enforced rule once, the shown one first; no sub-second w; no shadow rule"
        );
        assert_eq!(draft[4], ("ratelimit", "\"per-user\";r=7;t=2".to_string()));
    }

    #[test]
    fn the_shown_policy_leads_the_list() {
        let config = four_rules(true);
        let all = every_rule_planned(&config);
        let result = result(true, 0, 10, 0);
        let shown = Shown {
            rule: &all[2],
            all: &all,
            result: &result,
            now_ms: 0,
        };
        let headers = RateLimitFields::of(&shown, &config).pairs();
        assert!(
            headers[3].1.starts_with("\"fast\";q=10, \"per-user\""),
            "{headers:?}"
        );
        assert_eq!(headers[4].1, "\"fast\";r=0;t=1");
    }

    #[test]
    fn a_draft_refusal_is_a_problem_whose_window_ends_with_retry_after() {
        let config = four_rules(true);
        let all = every_rule_planned(&config);
        let result = result(false, 0, 59_400, 2_001);
        let shown = Shown {
            rule: &all[0],
            all: &all,
            result: &result,
            now_ms: 0,
        };
        let reply = too_many_requests(&shown, &config);
        let header = |name| {
            reply
                .headers
                .iter()
                .find(|h| h.0 == name)
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(header("retry-after"), "3");
        assert_eq!(header("ratelimit"), "\"per-user\";r=0;t=3");
        assert_eq!(header("content-type"), "application/problem+json");
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(body["violated-policies"], serde_json::json!(["per-user"]));
        assert_eq!(body["error"], "Rate limit exceeded");

        let blocked = blocked(&shown, 403, &config);
        let body: serde_json::Value = serde_json::from_str(&blocked.body).unwrap();
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
        );
        assert_eq!(blocked.status, 403);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let config = four_rules(false);
        let all = every_rule_planned(&config);
        for (wait_ms, expect) in [(0, 1), (1, 1), (1000, 1), (1001, 2), (60_000, 60)] {
            let result = result(false, 0, 0, wait_ms);
            let shown = Shown {
                rule: &all[0],
                all: &all,
                result: &result,
                now_ms: 0,
            };
            assert_eq!(shown.retry_after_s(), expect, "{wait_ms}");
        }
    }

    #[test]
    fn a_missing_identity_is_named_in_json_whatever_its_claim_is_called() {
        let json = r#"{"backend": {"cluster": "b"},
            "identity": {"user": {"jwt": {"header": "x-jwt", "claim": "a\"b\\c"}, "missing": "deny"}},
            "rules": [{"name": "per-user", "key": ["user"], "limit": {"requests": 1, "per": "1s"}}]}"#;
        let config = Config::parse(json.as_bytes()).unwrap();
        let reply = missing_identity(&config, 0, 0);
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(
            body["message"],
            r#"This request lacks the claim "a\"b\\c" of a JWT in the x-jwt header, which the rate limit "per-user" needs to count it."#
        );
    }
}
