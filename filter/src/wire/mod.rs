//! The filter's side of the wire format (specified in the `ratelimit-protocol` crate, which
//! the bridge speaks too): a planned check becomes one line of an exchange's batch.
//!
//! A layer of its own because the transport is the one thing the builds do not share: the
//! bridge reads the batch as it is (over the worker's stream or a callout), while the
//! redis-call build sends it to Redis itself (`redis_call`: the same batch as one RESP
//! `EVALSHA`, the script's reply read back into the results the bridge's reply would
//! have). Either way, what is above sees the same lines go out and the same
//! `CheckResult`s come back.

pub mod redis_call;

use ratelimit_config::backend::Backend;
use ratelimit_config::limit::Limit;
pub use ratelimit_protocol::RuleSpecRef;
pub use ratelimit_protocol::{
    decode_reply, split_message, stream_message, CheckResult, RuleResult, GRPC_METHOD,
    GRPC_SERVICE, MAX_REPLY_LEN, PATH,
};
use ratelimit_protocol::{encode_rule, end_check, start_lease_return};

/// Appends one check's line (all its rules) to a batch: a request's planned rules
/// (`PlannedRule::spec_ref`), or a top-up's one rule.
pub fn encode_check<'a>(body: &mut String, rules: impl IntoIterator<Item = RuleSpecRef<'a>>) {
    for (i, rule) in rules.into_iter().enumerate() {
        encode_rule(body, i == 0, rule);
    }
    end_check(body);
}

/// Appends a lease return: a line that gives `tokens` a lease did not use back to the
/// bucket `key`.
pub fn encode_return(body: &mut String, key: &str, limit: &Limit, tokens: u64) {
    let rule = RuleSpecRef {
        key,
        burst: limit.burst,
        num: limit.num,
        den: limit.den,
        cost: tokens,
        lease: 0,
        block: None,
        shadow: false,
        settle: None,
        global: None,
        slot: None,
        // Only a bucket that leases returns tokens, and a calendar quota leases none.
        calendar: None,
    };
    start_lease_return(body);
    encode_check(body, [rule]);
}

/// The headers of an HTTP callout carrying a batch to the bridge: `POST` to its path at
/// the backend's authority, and the backend's token if it has one.
pub fn callout_headers(backend: &Backend) -> Vec<(&str, &str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", PATH),
        (":authority", backend.authority.as_str()),
        ("content-type", "text/plain"),
    ];
    if let Some(authorization) = &backend.authorization {
        headers.push(("authorization", authorization.expose()));
    }
    headers
}

/// The initial metadata of the worker's gRPC stream to the bridge: the backend's token, if
/// it has one.
pub fn stream_metadata(backend: &Backend) -> Vec<(&str, &[u8])> {
    let token = backend.authorization.as_ref();
    token.map_or_else(Vec::new, |t| vec![("authorization", t.expose().as_bytes())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::planned;

    #[test]
    fn a_check_encodes_as_one_line_of_rules() {
        let mut body = String::new();
        let first = [
            planned("rl:a:x", 10, 1, 6000, 1),
            planned("rl:g", 5, 50, 1, 2),
        ];
        let config = crate::fakes::example("closed");
        encode_check(&mut body, first.iter().map(|p| p.spec_ref(&config)));
        encode_check(&mut body, [planned("rl:b", 1, 1, 1, 1).spec_ref(&config)]);
        assert_eq!(body, "rl:a:x,10,1,6000,1 rl:g,5,50,1,2\nrl:b,1,1,1,1\n");
    }

    #[test]
    fn callouts_and_the_stream_carry_the_backends_token_only_when_it_has_one() {
        let parse = |token: &str| {
            let json = format!(
                r#"{{"backend": {{"cluster": "rl", "authority": "bridge.local"{token}}},
                    "identity": {{"u": {{"header": "x-u"}}}},
                    "rules": [{{"name": "r", "key": ["u"], "limit": {{"requests": 1, "per": "1s"}}}}]}}"#
            );
            ratelimit_config::config::Config::parse(json.as_bytes())
                .unwrap()
                .backend
        };
        let open = parse("");
        let headers = callout_headers(&open);
        assert_eq!(
            headers,
            [
                (":method", "POST"),
                (":path", PATH),
                (":authority", "bridge.local"),
                ("content-type", "text/plain")
            ]
        );
        assert!(stream_metadata(&open).is_empty());
        let guarded = parse(r#", "token": "s3cret""#);
        let headers = callout_headers(&guarded);
        assert_eq!(headers.last(), Some(&("authorization", "Bearer s3cret")));
        assert_eq!(
            stream_metadata(&guarded),
            [("authorization", &b"Bearer s3cret"[..])]
        );
    }
}
