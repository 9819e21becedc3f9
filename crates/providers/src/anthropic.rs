//! Assembling an Anthropic Messages stream into a [`Reply`].
//!
//! Events: `message_start` (id, model, input usage), `content_block_start` (a text block, or
//! a `tool_use` block with id and name), `content_block_delta` (`text_delta`, or
//! `input_json_delta` pieces of a tool's input), `content_block_stop`, `message_delta` (stop
//! reason, output usage), `message_stop`; `ping` is ignored and `error` fails the stream. A
//! tool call cut off by `max_tokens` is an error, never invented arguments; a `refusal` is
//! surfaced as one.

use serde_json::Value;

use crate::openai::preview;
use crate::sse::Event;
use crate::{Reply, Stop, StreamError, Usage, provider_message};

#[derive(Debug)]
enum Block {
    Text,
    Tool { id: String, name: String, json: String },
    Other,
}

/// Assembles one streamed response.
#[derive(Debug, Default)]
pub struct Assembler {
    blocks: Vec<(u64, Block)>,
    text: String,
    stop: Option<String>,
    refusal: Option<String>,
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

    /// Whether `message_stop` has arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes one SSE event.
    pub fn push(&mut self, event: &Event) -> Result<(), StreamError> {
        if event.event == "ping" {
            return Ok(());
        }
        let v: Value = serde_json::from_str(&event.data)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(&event.data))))?;
        self.push_value(&event.event, &v)
    }

    /// Takes one event's data, already parsed; its `type`, else `event`, names its kind.
    fn push_value(&mut self, event: &str, v: &Value) -> Result<(), StreamError> {
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "error" => {
                return Err(StreamError::Provider(provider_message(v.get("error").unwrap_or(v))));
            }
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                self.id = m.get("id").and_then(Value::as_str).map(str::to_owned);
                self.model = m.get("model").and_then(Value::as_str).map(str::to_owned);
                if let Some(u) = m.get("usage") {
                    self.take_usage(u);
                }
            }
            "content_block_start" => {
                let index = index(v)?;
                let block = v.get("content_block").unwrap_or(&Value::Null);
                let b = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = block.get("text").and_then(Value::as_str) {
                            self.text.push_str(t);
                        }
                        Block::Text
                    }
                    Some("tool_use") => Block::Tool {
                        id: block.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
                        name: block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.push((index, b));
            }
            "content_block_delta" => {
                let index = index(v)?;
                let delta = v.get("delta").unwrap_or(&Value::Null);
                let block = self.blocks.iter_mut().find(|(i, _)| *i == index).map(|(_, b)| b);
                match (delta.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        self.text.push_str(
                            delta.get("text").and_then(Value::as_str).unwrap_or_default(),
                        );
                    }
                    (Some("input_json_delta"), Some(Block::Tool { json, .. })) => {
                        json.push_str(
                            delta.get("partial_json").and_then(Value::as_str).unwrap_or_default(),
                        );
                    }
                    (_, None) => {
                        return Err(StreamError::Malformed(format!(
                            "a delta for block {index}, which never started"
                        )));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) =
                    v.get("delta").and_then(|d| d.get("stop_reason")).and_then(Value::as_str)
                {
                    self.stop = Some(reason.to_owned());
                }
                if let Some(explanation) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_details"))
                    .and_then(|d| d.get("explanation"))
                    .and_then(Value::as_str)
                {
                    self.refusal = Some(explanation.to_owned());
                }
                if let Some(u) = v.get("usage") {
                    self.take_usage(u);
                }
            }
            "message_stop" => self.done = true,
            _ => {}
        }
        Ok(())
    }

    fn take_usage(&mut self, u: &Value) {
        if let Some(n) = u.get("input_tokens").and_then(Value::as_u64) {
            self.usage.input_tokens = n;
        }
        if let Some(n) = u.get("output_tokens").and_then(Value::as_u64) {
            self.usage.output_tokens = n;
        }
        if let Some(n) = u.get("cache_read_input_tokens").and_then(Value::as_u64) {
            self.usage.cached_input_tokens = n;
        }
    }

    /// The assembled reply.
    pub fn finish(self) -> Result<Reply, StreamError> {
        let stop = match self.stop.as_deref() {
            None => return Err(StreamError::Incomplete),
            Some("end_turn") => Stop::EndTurn,
            Some("tool_use") => Stop::ToolUse,
            Some("max_tokens") => Stop::MaxTokens,
            Some("stop_sequence") => Stop::StopSequence,
            Some("refusal") => Stop::Refusal(self.refusal),
            Some(other) => Stop::Other(other.to_owned()),
        };
        let mut tool_calls = Vec::new();
        for (_, block) in self.blocks {
            if let Block::Tool { id, name, json } = block {
                tool_calls.push(crate::tool_call(id, name, &json, &stop)?);
            }
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

/// Reads a non-streamed response (`stream: false`) by replaying it as the events a stream
/// would have carried, so both paths share the assembly.
pub fn from_response(body: &Value) -> Result<Reply, StreamError> {
    if let Some(error) = body.get("error") {
        return Err(StreamError::Provider(provider_message(error)));
    }
    let mut a = Assembler::new();
    let mut push = |kind: &str, data: Value| a.push_value(kind, &data);
    push(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"id": body.get("id"), "model": body.get("model"), "usage": body.get("usage")}}),
    )?;
    for (i, block) in
        body.get("content").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => {
                let start = serde_json::json!({"type": "tool_use", "id": block.get("id"), "name": block.get("name")});
                push(
                    "content_block_start",
                    serde_json::json!({"type": "content_block_start", "index": i, "content_block": start}),
                )?;
                let input = block
                    .get("input")
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({}))
                    .to_string();
                push(
                    "content_block_delta",
                    serde_json::json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": input}}),
                )?;
            }
            _ => {
                push(
                    "content_block_start",
                    serde_json::json!({"type": "content_block_start", "index": i, "content_block": block}),
                )?;
            }
        }
    }
    push(
        "message_delta",
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": body.get("stop_reason"), "stop_details": body.get("stop_details")}, "usage": body.get("usage")}),
    )?;
    a.finish()
}

fn index(v: &Value) -> Result<u64, StreamError> {
    v.get("index").and_then(Value::as_u64).ok_or_else(|| {
        StreamError::Malformed(format!("an event without an index: {}", preview(&v.to_string())))
    })
}
