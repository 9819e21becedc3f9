//! Cassettes: recorded model answers, keyed by request, that drive a run without any model.
//!
//! `Recorder` wraps a real provider and writes every request it answers; `Replayer` answers
//! from a cassette only — a request with no recording is a hard error naming the level, the
//! request's hash and how it differs from the nearest recorded request. A run's own log can
//! be exported as a cassette ([`from_events`]), so any run becomes a regression fixture.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::cancel::CancelToken;
use crate::event::{Event, EventData, Usage};
use crate::limits;
use crate::model::{BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest};

/// Version of the cassette file format.
pub const FORMAT: u32 = 1;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `ModelRequest::hash` of the request.
    pub request_hash: String,
    pub level_id: String,
    /// How many calls the level made before this one in its run.
    pub call_index: u32,
    pub prompt: String,
    /// The conversation after the prompt (a tool loop's earlier turns), when there was one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<crate::model::Turn>,
    pub provider: String,
    pub model: String,
    pub text: String,
    pub tool_calls: Vec<crate::model::ToolCall>,
    pub usage: Usage,
    pub cost_usd: f64,
}

/// A cassette file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cassette {
    pub format: u32,
    pub entries: Vec<Entry>,
}

impl Cassette {
    /// Reads a cassette file.
    pub fn load(path: &Path) -> Result<Cassette, String> {
        let text = baton_scenario::capped::read_text(path, limits::CASSETTE_BYTES_MAX)
            .map_err(|e| format!("cannot read the cassette: {e}"))?;
        let c: Cassette = serde_json::from_str(&text)
            .map_err(|e| format!("cassette {} is not valid: {e}", path.display()))?;
        if c.format != FORMAT {
            return Err(format!(
                "cassette {} has format {}; this build reads {FORMAT}",
                path.display(),
                c.format
            ));
        }
        Ok(c)
    }

    /// Writes the cassette, atomically (a temporary file renamed over the old one).
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .map_err(|e| format!("cannot write cassette {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| format!("cannot write cassette {}: {e}", path.display()))
    }
}

/// A cassette built from a run's log: every model response with the prompt that asked for it.
pub fn from_events(events: &[Event]) -> Cassette {
    let mut prompts: BTreeMap<(String, u32, u32), String> = BTreeMap::new();
    let mut calls: BTreeMap<String, u32> = BTreeMap::new();
    let mut entries = Vec::new();
    for e in events {
        let level = e.level_id.clone().unwrap_or_default();
        let attempt = e.attempt.unwrap_or(0);
        match &e.data {
            EventData::PromptSent(p) => {
                prompts.insert((level, attempt, p.call), p.prompt.clone());
            }
            EventData::ModelResponse(r) => entries.push(Entry {
                call_index: {
                    let n = calls.entry(level.clone()).or_insert(0);
                    *n += 1;
                    *n - 1
                },
                request_hash: r.request_hash.clone(),
                prompt: prompts.remove(&(level.clone(), attempt, r.call)).unwrap_or_default(),
                turns: Vec::new(),
                level_id: level,
                provider: r.provider.clone(),
                model: r.model.clone(),
                text: r.text.clone(),
                tool_calls: r.tool_calls.clone(),
                usage: r.usage,
                cost_usd: r.cost_usd,
            }),
            _ => {}
        }
    }
    Cassette { format: FORMAT, entries }
}

/// Wraps a provider and records every answer into a cassette file.
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn ModelProvider>,
    path: PathBuf,
    cassette: Mutex<Cassette>,
}

impl Recorder {
    /// Records `inner`'s answers into `path` (starting a new cassette).
    pub fn new(inner: Arc<dyn ModelProvider>, path: PathBuf) -> Self {
        Recorder {
            inner,
            path,
            cassette: Mutex::new(Cassette { format: FORMAT, entries: Vec::new() }),
        }
    }
}

impl ModelProvider for Recorder {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let reply = self.inner.call(request, cancel).await?;
            let snapshot = {
                let mut c = match self.cassette.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                c.entries.push(Entry {
                    request_hash: request.hash(),
                    level_id: request.level_id.clone(),
                    call_index: request.call_index,
                    prompt: request.prompt.clone(),
                    turns: request.turns.clone(),
                    provider: reply.provider.clone(),
                    model: reply.model.clone(),
                    text: reply.text.clone(),
                    tool_calls: reply.tool_calls.clone(),
                    usage: reply.usage,
                    cost_usd: reply.cost_usd,
                });
                c.clone()
            };
            snapshot.save(&self.path).map_err(|message| ModelError::Failed {
                provider: "cassette".to_owned(),
                message,
            })?;
            Ok(reply)
        })
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        self.inner.worst_case_cost_usd(request)
    }
}

/// Answers from a cassette only; never calls a model. The n-th call of a level gets the
/// n-th recording of that level, which must be for the same request.
#[derive(Debug)]
pub struct Replayer {
    entries: Vec<Entry>,
}

impl Replayer {
    /// A replayer over a cassette.
    pub fn new(cassette: Cassette) -> Self {
        Replayer { entries: cassette.entries }
    }

    fn answer(&self, request: &ModelRequest) -> Result<&Entry, ModelError> {
        let hash = request.hash();
        let slot = self
            .entries
            .iter()
            .find(|e| e.level_id == request.level_id && e.call_index == request.call_index);
        let fail =
            |message: String| ModelError::Failed { provider: "cassette".to_owned(), message };
        match slot {
            Some(e) if e.request_hash == hash => Ok(e),
            Some(e) => {
                let (_, at, recorded, asked) = difference(&e.transcript(), &transcript(request));
                Err(fail(format!(
                    "no recording for level `{}`, request {}: call {} was recorded for another request ({}), whose prompt differs at character {at}: recorded {recorded:?}, asked {asked:?}",
                    request.level_id,
                    short(&hash),
                    request.call_index,
                    short(&e.request_hash)
                )))
            }
            None => {
                let nearest = self
                    .entries
                    .iter()
                    .filter(|e| e.level_id == request.level_id)
                    .min_by_key(|e| difference(&e.transcript(), &transcript(request)).0);
                let hint = match nearest {
                    Some(e) => {
                        let (_, at, recorded, asked) =
                            difference(&e.transcript(), &transcript(request));
                        format!(
                            "the nearest recording ({}) differs at character {at}: recorded {recorded:?}, asked {asked:?}",
                            short(&e.request_hash)
                        )
                    }
                    None => {
                        format!("the cassette has no recording for level `{}`", request.level_id)
                    }
                };
                Err(fail(format!(
                    "no recording for level `{}`, request {} (call {}); {hint}",
                    request.level_id,
                    short(&hash),
                    request.call_index
                )))
            }
        }
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

impl Entry {
    /// The prompt and the turns after it, as one text to compare.
    fn transcript(&self) -> String {
        joined(&self.prompt, &self.turns)
    }
}

fn transcript(request: &ModelRequest) -> String {
    joined(&request.prompt, &request.turns)
}

fn joined(prompt: &str, turns: &[crate::model::Turn]) -> String {
    if turns.is_empty() {
        return prompt.to_owned();
    }
    // Serialising turns cannot fail: no maps with non-string keys.
    format!("{prompt}\n{}", serde_json::to_string(turns).unwrap_or_default())
}

/// How far apart two prompts are, and where they first differ (with a short excerpt of each).
fn difference(a: &str, b: &str) -> (usize, usize, String, String) {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let excerpt = |s: &str| s.chars().skip(at).take(40).collect::<String>();
    let distance = a.chars().count().max(b.chars().count()) - at;
    (distance, at, excerpt(a), excerpt(b))
}

impl ModelProvider for Replayer {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let e = self.answer(request)?;
            Ok(ModelReply {
                provider: e.provider.clone(),
                model: e.model.clone(),
                text: e.text.clone(),
                tool_calls: e.tool_calls.clone(),
                usage: e.usage,
                cost_usd: e.cost_usd,
                routing: None,
                stop_reason: None,
                failovers: Vec::new(),
            })
        })
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        self.answer(request).map_or(0.0, |e| e.cost_usd)
    }
}
