//! The usage formats on responses shaped as each API sends them (a body, and a stream
//! split at every byte): what is measured.
use super::*;
use crate::fakes::{self, aws_message, FakeShared};
use ratelimit_config::loading::{load, Build};

fn config(usage: &str, weights: &str) -> Config {
    let json = format!(
        r#"{{"backend": {{"cluster": "b"}}, "rules": [{{"name": "tokens",
            "limit": {{"requests": 100000, "per": "1m"}},
            "meter": {{"usage": "{usage}", "weights": {weights}, "reserve": 100}}}}]}}"#
    );
    load(json.as_bytes(), Build::Bridge).unwrap()
}

/// What a response of `content_type` cut in two at `split` measured: (exactly, unread).
fn measured(config: &Config, content_type: &str, body: &[u8], split: usize) -> (u64, u64) {
    let (first, rest) = body.split_at(split);
    measured_as(config, content_type, &[first, rest], true)
}

/// What a response of `content_type` in `pieces` measured, `ended` or left by its client
/// before its end.
fn measured_as(config: &Config, content_type: &str, pieces: &[&[u8]], ended: bool) -> (u64, u64) {
    let plan = [PlannedRule {
        rule: 0,
        ..fakes::planned("rl:tokens:k", 100_000, 1, 60, 100)
    }];
    let took = RuleResult {
        allowed: true,
        ..RuleResult::default()
    };
    let mut m = Metering::reserved(config, &plan, &[took]).unwrap();
    m.response_headers(config, |name| match name {
        ":status" => Some(b"200".to_vec()),
        "content-type" => Some(content_type.as_bytes().to_vec()),
        _ => None,
    });
    for piece in pieces {
        m.body(piece);
    }
    if ended {
        m.ended();
    }
    let s = m.settle(config, "w1-1", &FakeShared::default(), 0);
    (s.measured, s.unmeasured)
}

/// `body` measures `cost` exactly, however it is split.
fn assert_measures(config: &Config, content_type: &str, body: &str, cost: u64) {
    for split in 0..=body.len() {
        let got = measured(config, content_type, body.as_bytes(), split);
        assert_eq!(got, (cost, 0), "split at {split}");
    }
}

const SSE: &str = "text/event-stream";
const JSON: &str = "application/json";
const AWS: &str = "application/vnd.amazon.eventstream";

#[test]
fn openai_chat_a_body_and_a_stream_that_asked_for_its_usage() {
    let config = config("openai-chat", r#"{"output": 4, "cached_input": 0}"#);
    let body = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o",
        "choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,
        "prompt_tokens_details":{"cached_tokens":1000,"audio_tokens":0},
        "completion_tokens_details":{"reasoning_tokens":64,"audio_tokens":0}}}"#;
    // 200 uncached + 4 x 300.
    assert_measures(&config, JSON, body, 1400);
    let stream = concat!(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
        "\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":",
        "{\"prompt_tokens\":19,\"completion_tokens\":10,\"total_tokens\":29,",
        "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
        "data: [DONE]\n\n"
    );
    assert_measures(&config, SSE, stream, 19 + 40);
}

#[test]
fn openai_responses_a_body_and_a_stream_completed() {
    let config = config("openai-responses", r#"{"output": 4, "reasoning": 8}"#);
    let body = r#"{"id":"resp_1","object":"response","status":"completed","output":[],
        "usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},
        "output_tokens":87,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":123}}"#;
    // 36 + 4 x 67 + 8 x 20.
    assert_measures(&config, JSON, body, 36 + 268 + 160);
    let stream = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",",
        "\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",",
        "\"status\":\"completed\",\"usage\":{\"input_tokens\":36,\"input_tokens_details\":",
        "{\"cached_tokens\":0},\"output_tokens\":87,\"output_tokens_details\":",
        "{\"reasoning_tokens\":20},\"total_tokens\":123}}}\n\n"
    );
    assert_measures(&config, SSE, stream, 36 + 268 + 160);
}

#[test]
fn anthropic_a_body_and_a_stream_whose_last_event_repeats_its_input() {
    let config = config(
        "anthropic",
        r#"{"output": 5, "cached_input": 0, "cache_write": 2}"#,
    );
    let body = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],
        "stop_reason":"end_turn","usage":{"input_tokens":25,"cache_creation_input_tokens":10,
        "cache_read_input_tokens":400,"output_tokens":15}}"#;
    // 25 + 2 x 10 + 0 x 400 + 5 x 15.
    assert_measures(&config, JSON, body, 120);
    let stream = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],",
        "\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":10,",
        "\"cache_read_input_tokens\":400,\"output_tokens\":1}}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",",
        "\"text\":\"{\\\"usage\\\": {\\\"output_tokens\\\": 9999}}\"}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},",
        "\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":10,",
        "\"cache_read_input_tokens\":400,\"output_tokens\":15}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    assert_measures(&config, SSE, stream, 120);
    // An older stream: the input only in message_start.
    let older = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,",
        "\"output_tokens\":1}}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n"
    );
    assert_measures(&config, SSE, older, 100);
}

#[test]
fn gemini_a_body_and_chunks_each_with_the_usage_so_far() {
    let config = config("gemini", r#"{"output": 4, "cached_input": 0}"#);
    let body = r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"finishReason":"STOP"}],
        "usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":12,
        "toolUsePromptTokenCount":5,"thoughtsTokenCount":25,"totalTokenCount":142}}"#;
    // 40 uncached + 5 tool prompt + 4 x 12 + 4 x 25 (reasoning weighs output's).
    assert_measures(&config, JSON, body, 40 + 5 + 48 + 100);
    let stream = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}]}}],",
        "\"usageMetadata\":{\"promptTokenCount\":8,\"candidatesTokenCount\":2}}\r\n\r\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"}]},\"finishReason\":",
        "\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":8,\"candidatesTokenCount\":12,",
        "\"thoughtsTokenCount\":25,\"totalTokenCount\":45}}\r\n\r\n"
    );
    assert_measures(&config, SSE, stream, 8 + 48 + 100);
}

#[test]
fn bedrock_converse_a_body_and_a_converse_stream() {
    let config = config("bedrock-converse", r#"{"output": 5}"#);
    let body = r#"{"output":{"message":{"role":"assistant","content":[{"text":"Hi"}]}},
        "stopReason":"end_turn","usage":{"inputTokens":30,"outputTokens":628,"totalTokens":658,
        "cacheReadInputTokens":100,"cacheWriteInputTokens":7},"metrics":{"latencyMs":1275}}"#;
    assert_measures(&config, JSON, body, 30 + 5 * 628 + 100 + 7);
    let stream = [
        aws_message("messageStart", r#"{"role":"assistant"}"#),
        aws_message("contentBlockDelta", r#"{"delta":{"text":"Hi"}}"#),
        aws_message("messageStop", r#"{"stopReason":"end_turn"}"#),
        aws_message(
            "metadata",
            r#"{"usage":{"inputTokens":30,"outputTokens":628,"cacheReadInputTokens":100,"cacheWriteInputTokens":7},"metrics":{"latencyMs":9}}"#,
        ),
    ]
    .concat();
    for split in 0..=stream.len() {
        let got = measured(&config, AWS, &stream, split);
        assert_eq!(got, (30 + 5 * 628 + 100 + 7, 0), "split at {split}");
    }
}

#[test]
fn a_format_s_counts_that_contradict_or_fall_are_charged_as_unread() {
    let config = config("openai-chat", r#"{"cached_input": 0}"#);
    let lying = r#"{"usage":{"prompt_tokens":10,"completion_tokens":5,
        "prompt_tokens_details":{"cached_tokens":100000}}}"#;
    // Unread: the reservation's max (100), or what the counts show if more.
    assert_eq!(measured(&config, JSON, lying.as_bytes(), 0), (0, 1));
    let config = self::config("anthropic", "{}");
    let falling = concat!(
        "data: {\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
        "data: {\"usage\":{\"output_tokens\":15}}\n\n",
        "data: {\"usage\":{\"output_tokens\":3}}\n\n"
    );
    assert_eq!(measured(&config, SSE, falling.as_bytes(), 0), (0, 1));
}

#[test]
fn openai_chat_a_stream_left_after_its_done_is_charged_what_it_reported() {
    // OpenAI's SDK closes the connection on `[DONE]`, often before the stream's end
    // reaches the gateway (a race the SDK tests in real Envoy lost one time in four).
    let config = config("openai-chat", r#"{"output": 4, "cached_input": 0}"#);
    let usage = concat!(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":",
        "{\"prompt_tokens\":40,\"completion_tokens\":17,\"total_tokens\":57,",
        "\"prompt_tokens_details\":{\"cached_tokens\":15}}}\n\n"
    );
    // 25 uncached + 4 x 17.
    let done = format!("{usage}data: [DONE]\n\n");
    assert_eq!(
        measured_as(&config, SSE, &[done.as_bytes()], false),
        (93, 0)
    );
    // Left before `[DONE]`: what it reported may not be all, and the response is charged
    // as unread.
    assert_eq!(
        measured_as(&config, SSE, &[usage.as_bytes()], false),
        (0, 1)
    );
}
