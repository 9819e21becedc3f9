//! Model providers: the wire formats of the OpenAI-compatible Chat Completions and the
//! Anthropic Messages streaming APIs.
//!
//! [`sse`] parses Server-Sent Events per the WHATWG algorithm, whatever the chunking;
//! [`openai`] and [`anthropic`] assemble the events of one streamed response into a
//! [`Reply`]: text, tool calls with their arguments parsed, why it stopped, and usage.
//! Neither does I/O; the HTTP clients feed them.

pub mod anthropic;
pub mod cassette_file;
pub mod client;
pub mod config;
pub mod egress;
pub mod openai;
pub mod resolve;
pub mod sse;
pub mod tool_client;
pub mod webhook;

use serde_json::Value;

/// One streamed model response, assembled.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub stop: Stop,
    pub usage: Usage,
    /// The provider's id of the response, for error reports.
    pub response_id: Option<String>,
    pub model: Option<String>,
}

/// A tool call with its arguments parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// Why a response ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model finished its answer.
    EndTurn,
    /// The model asks for tool calls.
    ToolUse,
    /// The output limit cut the answer short.
    MaxTokens,
    /// The model refused; the explanation, when given.
    Refusal(Option<String>),
    /// A stop sequence ended it.
    StopSequence,
    /// Anything else the provider reported.
    Other(String),
}

/// Token counts of one response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's cache, where it reports them.
    pub cached_input_tokens: u64,
}

/// Why a stream could not be assembled into a reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("the provider reported an error: {0}")]
    Provider(String),
    #[error("malformed stream event: {0}")]
    Malformed(String),
    #[error("tool call `{name}` was cut off at the output limit; its arguments are incomplete")]
    TruncatedToolCall { name: String },
    #[error("tool call `{name}` has arguments that are not JSON: {reason}")]
    BadToolArguments { name: String, reason: String },
    #[error("the stream ended before the response was complete")]
    Incomplete,
}

/// A tool call's arguments, parsed: complete JSON, or an error saying why not — a call cut
/// off at the output limit is truncated, never completed by guessing.
pub(crate) fn tool_call(
    id: String,
    name: String,
    raw: &str,
    stop: &Stop,
) -> Result<ToolCall, StreamError> {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    match serde_json::from_str(raw) {
        Ok(arguments) => Ok(ToolCall { id, name, arguments }),
        Err(_) if *stop == Stop::MaxTokens => Err(StreamError::TruncatedToolCall { name }),
        Err(e) => Err(StreamError::BadToolArguments { name, reason: e.to_string() }),
    }
}

/// The message of a provider's `error` object: its `message` field, or the whole object.
pub(crate) fn provider_message(error: &Value) -> String {
    error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned)
}
