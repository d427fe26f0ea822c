//! What the client sees: rate-limit headers, the 429 reply, the failure-mode 503.

use crate::config::{Config, HeaderOptions};
use crate::limit::Limit;
use crate::protocol::RuleResult;
use ratelimit_protocol::u64_string;

/// A reply the filter sends itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// The rule whose numbers the client is shown, with its outcome and Redis's clock.
pub struct Shown<'a> {
    pub name: &'a str,
    pub limit: &'a Limit,
    pub result: &'a RuleResult,
    pub now_ms: u64,
}

impl Shown<'_> {
    fn reset_in_s(&self) -> u64 {
        self.result.full_ms.div_ceil(1000)
    }

    /// `Retry-After`: whole seconds, at least 1, so clients never retry at once.
    pub fn retry_after_s(&self) -> u64 {
        self.result.wait_ms.div_ceil(1000).max(1)
    }
}

/// `X-RateLimit-*` (and, if configured, the IETF draft fields) for the shown rule.
pub fn rate_limit_headers(
    shown: &Shown<'_>,
    options: HeaderOptions,
) -> Vec<(&'static str, String)> {
    // Both come from the bridge: saturate rather than trust them not to overflow.
    let reset_unix_s = shown
        .now_ms
        .saturating_add(shown.result.full_ms)
        .div_ceil(1000);
    let mut headers = vec![
        ("x-ratelimit-limit", u64_string(shown.limit.burst)),
        ("x-ratelimit-remaining", u64_string(shown.result.remaining)),
        ("x-ratelimit-reset", u64_string(reset_unix_s)),
    ];
    if options.ietf_draft {
        headers.push((
            "ratelimit-policy",
            format!(
                "\"{}\";q={};w={}",
                shown.name,
                shown.limit.burst,
                shown.limit.window_s()
            ),
        ));
        headers.push((
            "ratelimit",
            format!(
                "\"{}\";r={};t={}",
                shown.name,
                shown.result.remaining,
                shown.reset_in_s()
            ),
        ));
    }
    headers
}

/// The 429 for a denied request.
pub fn too_many_requests(shown: &Shown<'_>, config: &Config) -> LocalReply {
    let limit = shown.limit;
    let sentence = format!(
        "You have exceeded the rate limit of {} requests per {}.",
        limit.requests,
        limit.period_phrase()
    );
    refusal(shown, 429, "Rate limit exceeded", &sentence, config)
}

/// The reply to a blocked client: the rule's status, the usual headers, `Retry-After` the
/// rest of the block.
pub fn blocked(shown: &Shown<'_>, status: u32, config: &Config) -> LocalReply {
    let limit = shown.limit;
    let sentence = format!(
        "Too many of your requests were over the rate limit of {} requests per {}: you are blocked.",
        limit.requests,
        limit.period_phrase()
    );
    refusal(shown, status, "Blocked", &sentence, config)
}

/// A refused request's reply: the shown rule's headers, `Retry-After`, and a JSON body of
/// `error` and `sentence` (neither holds a character JSON would escape).
fn refusal(
    shown: &Shown<'_>,
    status: u32,
    error: &str,
    sentence: &str,
    config: &Config,
) -> LocalReply {
    let retry = shown.retry_after_s();
    let mut headers = rate_limit_headers(shown, config.headers);
    headers.push(("retry-after", retry.to_string()));
    headers.push(("content-type", "application/json".into()));
    let plural = if retry == 1 { "" } else { "s" };
    let body = format!(
        "{{\"error\": \"{error}\", \"message\": \"{sentence} Try again in {retry} second{plural}.\"}}"
    );
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

/// The 400 for a request whose identity cannot be told: `header` came more than once.
pub fn repeated_header(header: &str) -> LocalReply {
    // Header names are validated at load ([A-Za-z0-9-_!#$%&'*+.^`|~]): no JSON escaping
    // needed beyond what that alphabet already rules out.
    LocalReply {
        status: 400,
        headers: vec![("content-type", "application/json".into())],
        body: format!(
            "{{\"error\": \"Bad request\", \"message\": \"The {header} header appears more than once.\"}}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit() -> Limit {
        Limit {
            requests: 100,
            per_ms: 60_000,
            burst: 100,
            num: 1,
            den: 600,
        }
    }

    #[test]
    fn denial_renders_the_documented_headers_and_body() {
        let result = RuleResult {
            allowed: false,
            blocked: false,
            remaining: 0,
            full_ms: 59_400,
            wait_ms: 599,
            leased: 0,
        };
        let l = limit();
        let shown = Shown {
            name: "per-ip",
            limit: &l,
            result: &result,
            now_ms: 1_640_995_140_600,
        };
        let config = crate::config::Config::parse(
            br#"{"backend":{"cluster":"b"},"rules":[{"name":"r","limit":{"requests":1,"per":"1s"}}]}"#,
        )
        .unwrap();
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
    }

    #[test]
    fn ietf_draft_fields_are_opt_in() {
        let result = RuleResult {
            allowed: true,
            blocked: false,
            remaining: 7,
            full_ms: 1_800,
            wait_ms: 0,
            leased: 0,
        };
        let l = limit();
        let shown = Shown {
            name: "per-user",
            limit: &l,
            result: &result,
            now_ms: 1_000,
        };
        let plain = rate_limit_headers(&shown, HeaderOptions::default());
        assert_eq!(plain.len(), 3);
        let draft = rate_limit_headers(
            &shown,
            HeaderOptions {
                on_allowed: true,
                ietf_draft: true,
            },
        );
        assert_eq!(
            draft[3],
            ("ratelimit-policy", "\"per-user\";q=100;w=60".to_string())
        );
        assert_eq!(draft[4], ("ratelimit", "\"per-user\";r=7;t=2".to_string()));
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let l = limit();
        let mut result = RuleResult {
            allowed: false,
            blocked: false,
            remaining: 0,
            full_ms: 0,
            wait_ms: 0,
            leased: 0,
        };
        for (wait_ms, expect) in [(0, 1), (1, 1), (1000, 1), (1001, 2), (60_000, 60)] {
            result.wait_ms = wait_ms;
            let shown = Shown {
                name: "r",
                limit: &l,
                result: &result,
                now_ms: 0,
            };
            assert_eq!(shown.retry_after_s(), expect, "{wait_ms}");
        }
    }
}
