//! Assembling an OpenAI-compatible Chat Completions stream into a [`Reply`].
//!
//! Each `data:` event holds a `chat.completion.chunk`; `[DONE]` ends the stream. Text
//! arrives in `choices[0].delta.content`; tool calls arrive in pieces keyed by `index` — the
//! first piece carries the id and name, later ones append to `function.arguments`; usage
//! comes in a final chunk whose `choices` is empty (with `stream_options.include_usage`).

use serde_json::Value;

use crate::sse::Event;
use crate::{Reply, Stop, StreamError, Usage, provider_message};

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles one streamed response.
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    calls: Vec<(u64, PartialCall)>,
    finish: Option<String>,
    usage: Usage,
    id: Option<String>,
    model: Option<String>,
    done: bool,
}

impl Assembler {
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
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(data))))?;
        self.push_chunk(&chunk)
    }

    /// Takes one chunk, already parsed.
    fn push_chunk(&mut self, chunk: &Value) -> Result<(), StreamError> {
        if let Some(error) = chunk.get("error") {
            return Err(StreamError::Provider(provider_message(error)));
        }
        if self.id.is_none() {
            self.id = chunk.get("id").and_then(Value::as_str).map(str::to_owned);
            self.model = chunk.get("model").and_then(Value::as_str).map(str::to_owned);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.usage.input_tokens = n("prompt_tokens");
            self.usage.output_tokens = n("completion_tokens");
            self.usage.cached_input_tokens = usage
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first())
        else {
            return Ok(());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else { return Ok(()) };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.text.push_str(text);
        }
        if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
            self.finish.get_or_insert_with(|| "refusal".to_owned());
            self.text.push_str(refusal);
        }
        for piece in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = piece.get("index").and_then(Value::as_u64).unwrap_or(0);
            let slot = match self.calls.iter().position(|(i, _)| *i == index) {
                Some(p) => &mut self.calls[p].1,
                None => {
                    self.calls.push((index, PartialCall::default()));
                    &mut self.calls.last_mut().expect("a call was just pushed").1
                }
            };
            if let Some(id) = piece.get("id").and_then(Value::as_str) {
                slot.id = id.to_owned();
            }
            if let Some(function) = piece.get("function") {
                if let Some(name) = function.get("name").and_then(Value::as_str) {
                    slot.name.push_str(name);
                }
                if let Some(args) = function.get("arguments").and_then(Value::as_str) {
                    slot.arguments.push_str(args);
                }
            }
        }
        Ok(())
    }

    /// The assembled reply. Tool call arguments must be complete JSON.
    pub fn finish(mut self) -> Result<Reply, StreamError> {
        let stop = match self.finish.as_deref() {
            None => return Err(StreamError::Incomplete),
            Some("stop") => Stop::EndTurn,
            Some("tool_calls" | "function_call") => Stop::ToolUse,
            Some("length") => Stop::MaxTokens,
            Some("content_filter" | "refusal") => Stop::Refusal(None),
            Some(other) => Stop::Other(other.to_owned()),
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

/// Reads a non-streamed response (`stream: false`): its message is taken as one chunk
/// holding everything, so both paths share the assembly.
pub fn from_response(body: &Value) -> Result<Reply, StreamError> {
    let mut a = Assembler::new();
    let mut chunk = body.clone();
    if let Some(choices) = chunk.get_mut("choices").and_then(Value::as_array_mut) {
        for choice in choices {
            let Some(message) = choice.get_mut("message").map(Value::take) else { continue };
            let mut delta = message;
            if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for (i, call) in calls.iter_mut().enumerate() {
                    call["index"] = Value::from(i);
                }
            }
            choice["delta"] = delta;
        }
    }
    a.push_chunk(&chunk)?;
    a.finish()
}

pub(crate) fn preview(s: &str) -> String {
    let cut: String = s.chars().take(120).collect();
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}
