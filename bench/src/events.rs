//! The streamed response the bench meters: an OpenAI-compatible chat completion of
//! `CHUNKS` server-sent events, as `stream_options.include_usage` asks for them (content
//! events, one with the usage, then `[DONE]`).
//!
//! One definition for both places that measure metering on it: `sse-upstream` serves it to
//! Envoy (req/s, bench/streams.py) and `wasm-fuel` (bench/fuel, a crate of its own that
//! compiles this file as a module by path rather than depend on the load generator's whole
//! crate) feeds it to the filter chunk by chunk (fuel).

/// Chunks of a streamed response: content events, the usage event, then `[DONE]`.
pub const CHUNKS: usize = 50;
/// The usage the response reports: a fixed prompt, a token per content event.
pub const PROMPT_TOKENS: usize = 12;
pub const COMPLETION_TOKENS: usize = CHUNKS - 2;

/// Chunk `i` of `CHUNKS`: a content event, the usage event, or `[DONE]`.
pub fn chunk(i: usize) -> String {
    let head =
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","#;
    match CHUNKS - i {
        1 => "data: [DONE]\n\n".to_string(),
        2 => format!(
            "data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":{PROMPT_TOKENS},\"completion_tokens\":{COMPLETION_TOKENS},\"total_tokens\":{}}}}}\n\n",
            PROMPT_TOKENS + COMPLETION_TOKENS
        ),
        _ => format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}},\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ),
    }
}
