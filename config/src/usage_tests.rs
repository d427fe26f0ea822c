use crate::config::Config;
use crate::loading::{load, Build};
use crate::meter::MeterPolicy;

fn loaded(meter: &str) -> Result<Config, String> {
    let text = format!(
        r#"{{"backend": {{"cluster": "b"}}, "rules": [{{"name": "tokens",
             "limit": {{"requests": 100000, "per": "1m"}}, "meter": {meter}}}]}}"#
    );
    load(text.as_bytes(), Build::Bridge).map_err(|e| e.to_string())
}

fn meter(usage: &str, weights: &str) -> MeterPolicy {
    let config = loaded(&format!(
        r#"{{"usage": "{usage}", "weights": {weights}, "reserve": 100}}"#
    ))
    .unwrap();
    config.rules[0].meter.clone().unwrap()
}

/// The values a reader would find: `found` (path, count) at the meter's paths.
fn values(meter: &MeterPolicy, found: &[(&str, u64)]) -> Vec<Option<u64>> {
    (meter.paths().iter())
        .map(|p| {
            let path = p.join(".");
            found.iter().find(|(f, _)| *f == path).map(|(_, n)| *n)
        })
        .collect()
}

/// What format `usage` under `weights` makes of a body whose counts are `found`.
fn cost(usage: &str, weights: &str, found: &[(&str, u64)]) -> Option<u64> {
    let m = meter(usage, weights);
    m.cost_of(&values(&m, found))
}

const OPENAI: [(&str, u64); 4] = [
    ("usage.prompt_tokens", 100),
    ("usage.prompt_tokens_details.cached_tokens", 40),
    ("usage.completion_tokens", 30),
    ("usage.completion_tokens_details.reasoning_tokens", 20),
];

#[test]
fn by_default_a_response_costs_every_token_its_api_counted() {
    let anthropic = [
        ("usage.input_tokens", 10),
        ("usage.cache_read_input_tokens", 200),
        ("usage.cache_creation_input_tokens", 50),
        ("usage.output_tokens", 7),
    ];
    let gemini = [
        ("usageMetadata.promptTokenCount", 100),
        ("usageMetadata.cachedContentTokenCount", 60),
        ("usageMetadata.toolUsePromptTokenCount", 5),
        ("usageMetadata.candidatesTokenCount", 40),
        ("usageMetadata.thoughtsTokenCount", 25),
    ];
    // Cached and reasoning tokens are within OpenAI's counts; Anthropic's cache reads and
    // writes apart from its input; Gemini's thoughts apart from its candidates.
    for (usage, found, expected) in [
        ("openai-chat", &OPENAI[..], 130),
        ("anthropic", &anthropic[..], 267),
        ("gemini", &gemini[..], 170),
    ] {
        assert_eq!(cost(usage, "{}", found), Some(expected), "{usage}");
    }
}

#[test]
fn weights_price_each_class_and_a_count_within_another_replaces_its_units() {
    let weights = r#"{"input": 2, "cached_input": 1, "output": 8, "reasoning": 0}"#;
    // 60 x 2 + 40 x 1 + 10 x 8 + 20 x 0.
    assert_eq!(cost("openai-chat", weights, &OPENAI), Some(240));
    // Unread: the largest counts at the highest weight of each whole and its parts.
    let openai = meter("openai-chat", weights);
    assert_eq!(openai.at_least(&values(&openai, &OPENAI)), 100 * 2 + 30 * 8);
    let bedrock = [
        ("usage.inputTokens", 11),
        ("usage.outputTokens", 3),
        ("usage.cacheReadInputTokens", 100),
        ("usage.cacheWriteInputTokens", 9),
    ];
    let weights = r#"{"output": 5, "cache_write": 0}"#;
    let priced = cost("bedrock-converse", weights, &bedrock);
    assert_eq!(priced, Some(11 + 15 + 100), "cached input is input's");
}

#[test]
fn one_count_written_in_two_places_counts_once_at_its_largest() {
    // An Anthropic stream: input in message_start, repeated by message_delta; output 1 at
    // the start, 15 at the end.
    let anthropic = [
        ("message.usage.input_tokens", 12),
        ("message.usage.output_tokens", 1),
        ("usage.input_tokens", 12),
        ("usage.output_tokens", 15),
    ];
    assert_eq!(cost("anthropic", "{}", &anthropic), Some(27));
    let responses = [
        ("response.usage.input_tokens", 9),
        ("response.usage.output_tokens", 4),
    ];
    assert_eq!(cost("openai-responses", "{}", &responses), Some(13));
}

#[test]
fn counts_that_contradict_each_other_are_no_measure() {
    let openai = meter("openai-chat", r#"{"cached_input": 0}"#);
    let lying = values(
        &openai,
        &[
            ("usage.prompt_tokens", 10),
            ("usage.prompt_tokens_details.cached_tokens", 1_000_000),
            ("usage.completion_tokens", 5),
        ],
    );
    assert_eq!(openai.cost_of(&lying), None, "more cached than prompted");
    assert_eq!(
        openai.at_least(&lying),
        15,
        "no discount it may not have earned"
    );
    assert_eq!(openai.cost_of(&values(&openai, &[])), None, "nothing seen");
}

#[test]
fn a_usage_format_is_refused_naming_what_is_wrong() {
    for (meter, field, says) in [
        (
            r#"{"usage": "openai", "reserve": 1}"#,
            "rules[0].meter.usage",
            "anthropic",
        ),
        (
            r#"{"usage": "anthropic", "weights": {"reasoning": 2}, "reserve": 1}"#,
            "rules[0].meter.weights.reasoning",
            "anthropic reports no reasoning",
        ),
        (
            r#"{"usage": "gemini", "weights": {"cache_write": 1}, "reserve": 1}"#,
            "rules[0].meter.weights.cache_write",
            "no cache_write",
        ),
        (
            r#"{"usage": "gemini", "weights": {"prompt": 1}, "reserve": 1}"#,
            "rules[0].meter.weights.prompt",
            "cached_input",
        ),
        (
            r#"{"usage": "openai-chat", "weights": {"input": -1}, "reserve": 1}"#,
            "rules[0].meter.weights.input",
            "0 to 1000",
        ),
        (
            r#"{"usage": "openai-chat", "weights": {"output": 1001}, "reserve": 1}"#,
            "rules[0].meter.weights.output",
            "0 to 1000",
        ),
        (
            r#"{"usage": "openai-chat", "weights": {"input": 0, "output": 0}, "reserve": 1}"#,
            "rules[0].meter.weights",
            "nothing",
        ),
        (
            r#"{"usage": "openai-chat", "body": {"usage.total_tokens": 1}, "reserve": 1}"#,
            "rules[0].meter.body",
            "not both",
        ),
        (
            r#"{"body": {"usage.total_tokens": 1}, "weights": {"input": 1}, "reserve": 1}"#,
            "rules[0].meter.weights",
            "give usage",
        ),
        (r#"{"usage": 5, "reserve": 1}"#, "rules[0].meter.usage", ""),
    ] {
        let error = loaded(meter).unwrap_err();
        assert!(
            error.contains(&format!("{field}:")) && error.contains(says),
            "{meter}: {error}"
        );
    }
}

#[test]
fn every_format_reads_at_most_what_a_reader_holds() {
    for name in super::format_names() {
        let m = meter(name, "{}");
        assert!(m.paths().len() <= crate::meter::MAX_FIELDS, "{name}");
        assert!(m.body.iter().any(|f| f.weight > 0), "{name}");
    }
}
