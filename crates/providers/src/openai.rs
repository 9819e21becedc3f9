//! Assembling an OpenAI-compatible Chat Completions stream into a [`Reply`].
//!
//! Each `data:` event holds a `chat.completion.chunk`; `[DONE]` ends the stream. Text
//! arrives in `choices[0].delta.content`; tool calls arrive in pieces keyed by `index` — the
//! first piece carries the id and name, later ones append to `function.arguments`; usage
//! comes in a final chunk whose `choices` is empty (with `stream_options.include_usage`).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::sse::Event;
use crate::{Reply, Stop, StreamError, Usage, provider_message};

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// One `chat.completion.chunk` (or a whole non-streamed `chat.completion`, whose
/// `message` reads as a `delta`), with only the fields the assembly reads. Strings borrow
/// from the event's text where they can: the parse allocates little.
#[derive(Debug, Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<UsageDetails>,
}

#[derive(Debug, Deserialize)]
struct UsageDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow, alias = "message")]
    delta: Option<Delta<'a>>,
}

#[derive(Debug, Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<Piece<'a>>>,
}

#[derive(Debug, Deserialize)]
struct Piece<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<Function<'a>>,
}

#[derive(Debug, Deserialize)]
struct Function<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// Assembles one streamed response.
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    calls: Vec<(u64, PartialCall)>,
    finish: Option<String>,
    /// The model's refusal, kept apart from its text: a later `finish_reason` of `stop`
    /// does not turn it into an answer.
    refusal: Option<String>,
    usage: Usage,
    id: Option<String>,
    model: Option<String>,
    done: bool,
    /// Whether any chunk carried a choice.
    choices_seen: bool,
}

impl Assembler {
    /// Characters of answer text received so far (what a call cut short was paid for).
    pub fn received_chars(&self) -> usize {
        self.text.len()
    }

    /// The answer's text received so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// An empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `[DONE]` has arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes one SSE event.
    pub fn push(&mut self, event: &Event) -> Result<(), StreamError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Chunk<'_> = serde_json::from_str(data)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(data))))?;
        self.push_chunk(chunk)
    }

    /// Takes one chunk, already parsed.
    fn push_chunk(&mut self, chunk: Chunk<'_>) -> Result<(), StreamError> {
        if let Some(error) = &chunk.error {
            return Err(StreamError::Provider(provider_message(error)));
        }
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
            self.model = chunk.model.map(Cow::into_owned);
        }
        if let Some(usage) = chunk.usage {
            self.usage.input_tokens = usage.prompt_tokens.unwrap_or(0);
            self.usage.output_tokens = usage.completion_tokens.unwrap_or(0);
            self.usage.cached_input_tokens =
                usage.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0);
        }
        let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) else {
            return Ok(());
        };
        self.choices_seen = true;
        if let Some(reason) = choice.finish_reason {
            self.finish = Some(reason.into_owned());
        }
        let Some(delta) = choice.delta else { return Ok(()) };
        if let Some(text) = delta.content {
            self.text.push_str(&text);
        }
        if let Some(refusal) = delta.refusal {
            self.refusal.get_or_insert_with(String::new).push_str(&refusal);
        }
        for (position, piece) in delta.tool_calls.into_iter().flatten().enumerate() {
            // A non-streamed message lists its calls without an index: their order is it.
            let index = piece.index.unwrap_or(position as u64);
            let slot = match self.calls.iter().position(|(i, _)| *i == index) {
                Some(p) => &mut self.calls[p].1,
                None => {
                    self.calls.push((index, PartialCall::default()));
                    &mut self.calls.last_mut().expect("a call was just pushed").1
                }
            };
            if let Some(id) = piece.id {
                slot.id = id.into_owned();
            }
            if let Some(function) = piece.function {
                if let Some(name) = function.name {
                    slot.name.push_str(&name);
                }
                if let Some(args) = function.arguments {
                    slot.arguments.push_str(&args);
                }
            }
        }
        Ok(())
    }

    /// The assembled reply. Tool call arguments must be complete JSON.
    pub fn finish(mut self) -> Result<Reply, StreamError> {
        let stop = match self.finish.as_deref() {
            // A complete stream without a single choice is a wrong answer, not a dropped one.
            None if self.done && !self.choices_seen => {
                return Err(StreamError::Malformed(
                    "the stream ended without any choice (every `choices` array was empty)"
                        .to_owned(),
                ));
            }
            None => return Err(StreamError::Incomplete),
            Some("stop") => Stop::EndTurn,
            Some("tool_calls" | "function_call") => Stop::ToolUse,
            Some("length") => Stop::MaxTokens,
            Some("content_filter" | "refusal") => Stop::Refusal(None),
            Some(other) => Stop::Other(other.to_owned()),
        };
        // A refusal is kept as one, with its explanation, as Anthropic's are.
        let stop = match self.refusal.take() {
            Some(reason) => Stop::Refusal(Some(reason).filter(|r| !r.trim().is_empty())),
            None => stop,
        };
        self.calls.sort_by_key(|(i, _)| *i);
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (_, call) in self.calls {
            tool_calls.push(crate::tool_call(call.id, call.name, &call.arguments, &stop)?);
        }
        Ok(Reply {
            text: self.text,
            tool_calls,
            stop,
            usage: self.usage,
            response_id: self.id,
            model: self.model,
        })
    }
}

/// Reads a non-streamed response (`stream: false`): its message reads as one chunk's
/// delta holding everything, so both paths share the assembly.
pub fn from_response(body: &Value) -> Result<Reply, StreamError> {
    let chunk = Chunk::deserialize(body)
        .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(&body.to_string()))))?;
    if chunk.error.is_none() && chunk.choices.as_ref().is_none_or(Vec::is_empty) {
        return Err(StreamError::Malformed(format!(
            "the response has no choices (an empty or missing `choices` array): {}",
            preview(&body.to_string())
        )));
    }
    let mut a = Assembler::new();
    a.push_chunk(chunk)?;
    a.finish()
}

pub(crate) fn preview(s: &str) -> String {
    let cut: String = s.chars().take(120).collect();
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}
