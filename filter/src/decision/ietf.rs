//! The IETF draft-11 rate-limit fields (draft-ietf-httpapi-ratelimit-headers-11, May
//! 2026), emitted with `headers.ietf_draft`: `RateLimit-Policy` and `RateLimit`, both
//! structured-field Lists of String Items (RFC 9651).

use crate::decision::shown::Shown;
use ratelimit_config::config::Config;
use ratelimit_protocol::push_u64;

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11, section 3): a structured
/// field List with one Item per enforced rule of the request, the shown one first, e.g.
/// `"per-user";q=100;w=60, "global";q=5000;w=1;burst=10000`. `q` and `w` are the
/// configured `requests` and `per`; `w` is left out when `per` is not whole seconds (the
/// draft has no sub-second windows) or is a calendar period, and `burst` is added when it
/// differs from `q`, since a client may then see `r` above `q`. A metered rule counts an API's tokens, a unit the
/// draft's quota units (`qu`) do not register: it says so in a parameter of its own, as the
/// draft asks of one (prefixed), `ratelimit-unit="tokens"`.
pub fn policy_field(shown: &Shown<'_>, config: &Config) -> String {
    let enforced = shown.all.iter().filter(|p| !p.shadow);
    let mut listed: Vec<usize> = Vec::new();
    let mut field = String::new();
    for planned in std::iter::once(shown.rule).chain(enforced) {
        if listed.contains(&planned.rule) {
            continue;
        }
        listed.push(planned.rule);
        if !field.is_empty() {
            field.push_str(", ");
        }
        let limit = &planned.limit;
        push_policy_name(&mut field, config.rule_name(planned.rule));
        field.push_str(";q=");
        push_u64(&mut field, limit.requests);
        // A calendar quota's window is no fixed number of seconds: none is claimed.
        if limit.per_ms % 1000 == 0 && limit.calendar.is_none() {
            field.push_str(";w=");
            push_u64(&mut field, limit.per_ms / 1000);
        }
        if limit.burst != limit.requests {
            field.push_str(";burst=");
            push_u64(&mut field, limit.burst);
        }
        if config
            .rules
            .get(planned.rule)
            .is_some_and(|r| r.meter.is_some())
        {
            field.push_str(TOKENS_UNIT);
        }
    }
    field
}

/// The parameter that says a policy counts tokens.
const TOKENS_UNIT: &str = ";ratelimit-unit=\"tokens\"";

/// `RateLimit` (draft-11, section 4): the shown rule's service limit, `r` tokens left
/// within `t` seconds, e.g. `"per-user";r=7;t=2`.
pub fn service_limit_field(shown: &Shown<'_>, config: &Config) -> String {
    let mut field = String::new();
    push_policy_name(&mut field, config.rule_name(shown.rule.rule));
    field.push_str(";r=");
    push_u64(&mut field, shown.result.remaining);
    field.push_str(";t=");
    push_u64(&mut field, effective_window_s(shown));
    field
}

/// A rule name as a structured-field String. Names are validated at load to letters,
/// digits, `-`, `_` and `.`, none of which a String escapes.
fn push_policy_name(field: &mut String, name: &str) {
    field.push('"');
    field.push_str(name);
    field.push('"');
}

/// The draft's effective window: until the bucket is full, or on a refusal until the client
/// may retry, so that `Retry-After` never ends before it (draft-11, section 6).
fn effective_window_s(shown: &Shown<'_>) -> u64 {
    if shown.result.allowed {
        shown.result.full_ms.div_ceil(1000)
    } else {
        shown.retry_after_s()
    }
}
