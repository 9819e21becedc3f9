//! Assembling an Anthropic Messages stream into a [`Reply`].
//!
//! Events: `message_start` (id, model, input usage), `content_block_start` (a text block, or
//! a `tool_use` block with id and name), `content_block_delta` (`text_delta`, or
//! `input_json_delta` pieces of a tool's input), `content_block_stop`, `message_delta` (stop
//! reason, output usage), `message_stop`; `ping` is ignored and `error` fails the stream. A
//! tool call cut off by `max_tokens` is an error, never invented arguments; a `refusal` is
//! surfaced as one.

use std::borrow::Cow;

use serde::Deserialize;
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

/// One event's data, with only the fields the assembly reads; strings borrow from the
/// event's text where they can.
#[derive(Debug, Deserialize)]
struct Data<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, borrow)]
    message: Option<Message<'a>>,
    #[serde(default, borrow)]
    content_block: Option<ContentBlock<'a>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<UsageData>,
}

#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageData>,
}

#[derive(Debug, Deserialize)]
struct ContentBlock<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_details: Option<StopDetails<'a>>,
}

#[derive(Debug, Deserialize)]
struct StopDetails<'a> {
    #[serde(default, borrow)]
    explanation: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct UsageData {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
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

    /// Whether `message_stop` has arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes one SSE event.
    pub fn push(&mut self, event: &Event) -> Result<(), StreamError> {
        if event.event == "ping" {
            return Ok(());
        }
        let data: Data<'_> = serde_json::from_str(&event.data)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(&event.data))))?;
        self.push_data(&event.event, data)
    }

    /// Takes one event's data given as JSON (a non-streamed response replayed as events).
    fn push_value(&mut self, event: &str, v: &Value) -> Result<(), StreamError> {
        let data = Data::deserialize(v)
            .map_err(|e| StreamError::Malformed(format!("{e}: {}", preview(&v.to_string()))))?;
        self.push_data(event, data)
    }

    /// Takes one event's data; its `type`, else `event`, names its kind.
    fn push_data(&mut self, event: &str, d: Data<'_>) -> Result<(), StreamError> {
        let kind = d.kind.as_deref().unwrap_or(event);
        let index = || {
            d.index
                .ok_or_else(|| StreamError::Malformed(format!("a `{kind}` event without an index")))
        };
        match kind {
            "error" => {
                let message =
                    d.error.as_ref().map_or_else(|| "no details".to_owned(), provider_message);
                return Err(StreamError::Provider(message));
            }
            "message_start" => {
                if let Some(m) = d.message {
                    self.id = m.id.map(Cow::into_owned);
                    self.model = m.model.map(Cow::into_owned);
                    if let Some(u) = m.usage {
                        self.take_usage(&u);
                    }
                }
            }
            "content_block_start" => {
                let index = index()?;
                let block = d.content_block;
                let b = match block.as_ref().and_then(|b| b.kind.as_deref()) {
                    Some("text") => {
                        if let Some(t) = block.as_ref().and_then(|b| b.text.as_deref()) {
                            self.text.push_str(t);
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let block = block.as_ref();
                        let owned = |f: Option<&Cow<'_, str>>| {
                            f.map(ToString::to_string).unwrap_or_default()
                        };
                        Block::Tool {
                            id: owned(block.and_then(|b| b.id.as_ref())),
                            name: owned(block.and_then(|b| b.name.as_ref())),
                            json: String::new(),
                        }
                    }
                    _ => Block::Other,
                };
                self.blocks.push((index, b));
            }
            "content_block_delta" => {
                let index = index()?;
                let block = self.blocks.iter_mut().find(|(i, _)| *i == index).map(|(_, b)| b);
                let delta = d.delta.as_ref();
                match (delta.and_then(|x| x.kind.as_deref()), block) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        self.text
                            .push_str(delta.and_then(|x| x.text.as_deref()).unwrap_or_default());
                    }
                    (Some("input_json_delta"), Some(Block::Tool { json, .. })) => {
                        json.push_str(
                            delta.and_then(|x| x.partial_json.as_deref()).unwrap_or_default(),
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
                if let Some(delta) = &d.delta {
                    if let Some(reason) = &delta.stop_reason {
                        self.stop = Some(reason.to_string());
                    }
                    if let Some(explanation) =
                        delta.stop_details.as_ref().and_then(|s| s.explanation.as_ref())
                    {
                        self.refusal = Some(explanation.to_string());
                    }
                }
                if let Some(u) = &d.usage {
                    self.take_usage(u);
                }
            }
            "message_stop" => self.done = true,
            _ => {}
        }
        Ok(())
    }

    fn take_usage(&mut self, u: &UsageData) {
        if let Some(n) = u.input_tokens {
            self.usage.input_tokens = n;
        }
        if let Some(n) = u.output_tokens {
            self.usage.output_tokens = n;
        }
        if let Some(n) = u.cache_read_input_tokens {
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
