//! Usage formats by name (`"meter": {"usage": "anthropic"}`): where each LLM API reports
//! the tokens a response used, in its JSON body and in the events it streams, as classes
//! of tokens (input, output, cached input, cache writes, reasoning) a rule weighs.
//!
//! A format is a list of counts, each of a class, at one or more paths. Alternatives are
//! one count written in different places (Anthropic's input tokens in `message_start`
//! as `message.usage.input_tokens`, repeated by newer versions in `message_delta` as
//! `usage.input_tokens`): the largest of them counts, never their sum. A count may be
//! *within* another (OpenAI's cached tokens are some of its prompt tokens): it is then
//! priced at its own class's weight and the rest of the other at that one's. Each API's
//! counts only grow over a stream, so the last value of each path is its largest; the
//! reader distrusts a stream whose counts fell.

use crate::error::{err, ConfigError};
use std::collections::BTreeMap;

/// Largest weight of a field, either way.
pub const MAX_WEIGHT: i64 = 1_000;

/// One count of the response body a meter reads: the paths from the JSON value's root it
/// may be at (the largest of them counts: one count an API writes in different places),
/// the tokens one unit of it costs (below 0: it discounts, as cached prompt tokens may),
/// and the field it is some of (`within`, an index), whose units it then replaces: they
/// cost this field's weight, not that one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeteredField {
    pub paths: Vec<Vec<String>>,
    pub weight: i64,
    pub within: Option<usize>,
}

/// A class of tokens a format reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Input,
    Output,
    CachedInput,
    CacheWrite,
    Reasoning,
}

impl Class {
    const ALL: [Class; 5] = [
        Class::Input,
        Class::Output,
        Class::CachedInput,
        Class::CacheWrite,
        Class::Reasoning,
    ];

    /// Its name in `weights`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Input => "input",
            Class::Output => "output",
            Class::CachedInput => "cached_input",
            Class::CacheWrite => "cache_write",
            Class::Reasoning => "reasoning",
        }
    }

    /// The class whose weight it takes when `weights` gives it none: cached input and
    /// cache writes are input, reasoning is output, so that by default a response costs
    /// every token its API counted.
    fn parent(self) -> Option<Class> {
        match self {
            Class::CachedInput | Class::CacheWrite => Some(Class::Input),
            Class::Reasoning => Some(Class::Output),
            Class::Input | Class::Output => None,
        }
    }
}

/// One count of a format: its class, the paths it may be at (the largest counts), and the
/// index of the count it is some of, if it is.
#[derive(Debug)]
struct Count {
    class: Class,
    paths: &'static [&'static str],
    within: Option<usize>,
}

const fn count(class: Class, paths: &'static [&'static str]) -> Count {
    Count {
        class,
        paths,
        within: None,
    }
}

const fn within(class: Class, of: usize, paths: &'static [&'static str]) -> Count {
    Count {
        class,
        paths,
        within: Some(of),
    }
}

/// The format whose streams report usage only when the request asks
/// (`stream_options.include_usage`), which a meter's `include_usage` asks for the client.
pub const INCLUDES_USAGE: &str = "openai-chat";

/// The formats by name. Non-streamed bodies and streamed events of one API share the
/// paths a format names; an API that writes a count elsewhere when it streams has both.
const FORMATS: &[(&str, &[Count])] = &[
    // Chat Completions: the usage of a body, or of a stream's last event when the request
    // set `stream_options.include_usage`. Cached and reasoning tokens are some of the
    // prompt's and the completion's.
    (
        INCLUDES_USAGE,
        &[
            count(Class::Input, &["usage.prompt_tokens"]),
            count(Class::Output, &["usage.completion_tokens"]),
            within(
                Class::CachedInput,
                0,
                &["usage.prompt_tokens_details.cached_tokens"],
            ),
            within(
                Class::Reasoning,
                1,
                &["usage.completion_tokens_details.reasoning_tokens"],
            ),
        ],
    ),
    // Responses: a body's `usage`, a stream's in its `response.completed` event.
    (
        "openai-responses",
        &[
            count(
                Class::Input,
                &["usage.input_tokens", "response.usage.input_tokens"],
            ),
            count(
                Class::Output,
                &["usage.output_tokens", "response.usage.output_tokens"],
            ),
            within(
                Class::CachedInput,
                0,
                &[
                    "usage.input_tokens_details.cached_tokens",
                    "response.usage.input_tokens_details.cached_tokens",
                ],
            ),
            within(
                Class::Reasoning,
                1,
                &[
                    "usage.output_tokens_details.reasoning_tokens",
                    "response.usage.output_tokens_details.reasoning_tokens",
                ],
            ),
        ],
    ),
    // Messages: a body's `usage`; a stream's input in `message_start` (`message.usage`),
    // its output growing in `message_delta` (`usage`), which newer versions also give the
    // input. Cache reads and writes are counted apart from `input_tokens`.
    (
        "anthropic",
        &[
            count(
                Class::Input,
                &["usage.input_tokens", "message.usage.input_tokens"],
            ),
            count(
                Class::Output,
                &["usage.output_tokens", "message.usage.output_tokens"],
            ),
            count(
                Class::CachedInput,
                &[
                    "usage.cache_read_input_tokens",
                    "message.usage.cache_read_input_tokens",
                ],
            ),
            count(
                Class::CacheWrite,
                &[
                    "usage.cache_creation_input_tokens",
                    "message.usage.cache_creation_input_tokens",
                ],
            ),
        ],
    ),
    // generateContent: `usageMetadata`, in every chunk of a stream (`alt=sse`), growing.
    // The prompt's count includes its cached part; tool-use prompts and thoughts are
    // counted apart.
    (
        "gemini",
        &[
            count(Class::Input, &["usageMetadata.promptTokenCount"]),
            count(Class::Output, &["usageMetadata.candidatesTokenCount"]),
            within(
                Class::CachedInput,
                0,
                &["usageMetadata.cachedContentTokenCount"],
            ),
            count(Class::Input, &["usageMetadata.toolUsePromptTokenCount"]),
            count(Class::Reasoning, &["usageMetadata.thoughtsTokenCount"]),
        ],
    ),
    // Converse: a body's `usage`; cache reads and writes counted apart from `inputTokens`.
    (
        "bedrock-converse",
        &[
            count(Class::Input, &["usage.inputTokens"]),
            count(Class::Output, &["usage.outputTokens"]),
            count(Class::CachedInput, &["usage.cacheReadInputTokens"]),
            count(Class::CacheWrite, &["usage.cacheWriteInputTokens"]),
        ],
    ),
];

/// The names of the formats, for messages and the docs' test.
pub fn format_names() -> impl Iterator<Item = &'static str> {
    FORMATS.iter().map(|(name, _)| *name)
}

/// The fields a meter of format `name` reads, each weighed by `weights` (at `field`,
/// the meter's path in the configuration): a class's weight from 0 to `MAX_WEIGHT`, by
/// default its parent class's (input and output: 1).
pub(crate) fn fields(
    field: &str,
    name: &str,
    weights: &BTreeMap<String, i64>,
) -> Result<Vec<MeteredField>, ConfigError> {
    let Some((_, counts)) = FORMATS.iter().find(|(n, _)| *n == name) else {
        let known: Vec<_> = format_names().collect();
        return err(
            format!("{field}.usage"),
            format!("unknown usage format {name:?}: one of {}", known.join(", ")),
        );
    };
    for (class, weight) in weights {
        let at = format!("{field}.weights.{class}");
        let Some(known) = Class::ALL.iter().find(|c| c.name() == class) else {
            let names: Vec<_> = Class::ALL.iter().map(|c| c.name()).collect();
            return err(
                at,
                format!("not a class of tokens: one of {}", names.join(", ")),
            );
        };
        if !counts.iter().any(|c| c.class == *known) {
            return err(at, format!("{name} reports no {class} tokens"));
        }
        if !(0..=MAX_WEIGHT).contains(weight) {
            return err(at, format!("a weight is an integer from 0 to {MAX_WEIGHT}"));
        }
    }
    let weight = |class: Class| -> i64 {
        let mut c = Some(class);
        while let Some(now) = c {
            if let Some(w) = weights.get(now.name()) {
                return *w;
            }
            c = now.parent();
        }
        1
    };
    let fields: Vec<MeteredField> = (counts.iter())
        .map(|c| MeteredField {
            paths: c.paths.iter().map(|s| segments(s)).collect(),
            weight: weight(c.class),
            within: c.within,
        })
        .collect();
    if fields.iter().all(|f| f.weight == 0) {
        return err(
            format!("{field}.weights"),
            "every class weighs 0: nothing is metered",
        );
    }
    Ok(fields)
}

fn segments(path: &str) -> Vec<String> {
    path.split('.').map(str::to_string).collect()
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
