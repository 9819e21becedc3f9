//! Cassettes: recorded model answers, keyed by request, that drive a run without any model.
//!
//! Recording into a file is the embedder's (`baton-providers`' `cassette_file`); `Replayer` answers
//! from a cassette only — a request with no recording is a hard error naming the level, the
//! request's hash and how it differs from the nearest recorded request. A run's own log can
//! be exported as a cassette ([`from_events`]), so any run becomes a regression fixture.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::cancel::CancelToken;
use crate::event::{Event, EventData, Usage};
use crate::model::{BoxFuture, ModelError, ModelProvider, ModelReply, ModelRequest, STOP_REFUSAL};

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
    /// Why the call failed for good, when it did: the replay fails it the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The stop reason the answer came with, when it was not a plain end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// How the call was routed (the provider and model chosen, and why), when a router
    /// chose: the replay records the same decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<crate::event::RoutingDecision>,
}

impl Entry {
    /// The recording of `reply`, the answer to `request`.
    pub fn of(request: &ModelRequest, reply: &ModelReply) -> Entry {
        Entry {
            model: reply.model.clone(),
            text: reply.text.clone(),
            tool_calls: reply.tool_calls.clone(),
            usage: reply.usage,
            cost_usd: reply.cost_usd,
            error: None,
            stop_reason: reply.stop_reason.clone(),
            routing: reply.routing.clone(),
            ..Entry::failed(request, &reply.provider, "", false)
        }
    }

    /// The recording of a call to `provider` that failed for good with `message`.
    /// The recording of a call that failed for good; a refusal keeps its stop reason
    /// ([`STOP_REFUSAL`]), so its replay fails the same way.
    pub fn failed(request: &ModelRequest, provider: &str, message: &str, refused: bool) -> Entry {
        Entry {
            request_hash: request.hash(),
            level_id: request.level_id.clone(),
            call_index: request.call_index,
            prompt: request.prompt.clone(),
            turns: request.turns.clone(),
            provider: provider.to_owned(),
            model: String::new(),
            text: String::new(),
            tool_calls: Vec::new(),
            usage: Usage::default(),
            cost_usd: 0.0,
            error: Some(message.to_owned()),
            stop_reason: refused.then(|| STOP_REFUSAL.to_owned()),
            routing: None,
        }
    }
}

/// A cassette file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cassette {
    pub format: u32,
    pub entries: Vec<Entry>,
    /// What calls of the user's tools answered, in the order they were made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolEntry>,
    /// What MCP servers said of the tools the recorded run offered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listed: Vec<crate::event::ledger::ListedTool>,
}

/// One recorded call of a user's tool: what it was asked and what it answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolEntry {
    pub level_id: String,
    pub tool: String,
    pub arguments: serde_json::Value,
    pub content: String,
    pub is_error: bool,
}

impl Cassette {
    /// Reads a cassette from its text; `origin` (the file) names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Cassette, String> {
        let c: Cassette = serde_json::from_str(text)
            .map_err(|e| format!("cassette {origin} is not valid: {e}"))?;
        if c.format != FORMAT {
            return Err(format!(
                "cassette {origin} has format {}; this build reads {FORMAT}",
                c.format
            ));
        }
        Ok(c)
    }

    /// The cassette's text, as its file holds it.
    pub fn to_text(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A cassette built from a run's log: every model answer, and every call that failed for
/// good, with the prompt that asked for it.
pub fn from_events(events: &[Event]) -> Cassette {
    let mut cassette = model_answers(events);
    let mut arguments: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for e in events {
        match &e.data {
            EventData::ToolCall(c) => {
                arguments.insert(c.call_id.clone(), c.arguments.clone());
            }
            EventData::ToolCallFinished(f) => cassette.tools.push(ToolEntry {
                level_id: e.level_id.clone().unwrap_or_default(),
                tool: f.tool.clone(),
                arguments: arguments.get(&f.call_id).cloned().unwrap_or(serde_json::Value::Null),
                content: f.content.clone(),
                is_error: f.is_error,
            }),
            EventData::ToolsListed(l) => {
                for tool in &l.tools {
                    if !cassette.listed.iter().any(|t| t.name == tool.name) {
                        cassette.listed.push(tool.clone());
                    }
                }
            }
            _ => {}
        }
    }
    cassette
}

/// The model answers of a run's log, as [`from_events`] records them.
fn model_answers(events: &[Event]) -> Cassette {
    let mut prompts: BTreeMap<(String, u32, u32), String> = BTreeMap::new();
    // A level's call index counts its answers in the run, as the engine's does.
    let mut calls: BTreeMap<String, u32> = BTreeMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    // The routing decision recorded before each level's answer, for that answer.
    let mut routed: BTreeMap<String, crate::event::RoutingDecision> = BTreeMap::new();
    for e in events {
        let level = e.level_id.clone().unwrap_or_default();
        let attempt = e.attempt.unwrap_or(0);
        match &e.data {
            EventData::PromptSent(p) => {
                prompts.insert((level, attempt, p.call), p.prompt.clone());
            }
            EventData::RoutingDecision(r) => {
                routed.insert(level, r.clone());
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
                routing: routed.remove(&level),
                level_id: level,
                provider: r.provider.clone(),
                model: r.model.clone(),
                text: r.text.clone(),
                tool_calls: r.tool_calls.clone(),
                usage: r.usage,
                cost_usd: r.cost_usd,
                error: None,
                stop_reason: None,
            }),
            EventData::ModelStopped(stopped) => {
                if let Some(last) = entries.last_mut().filter(|x| x.level_id == level) {
                    last.stop_reason = Some(stopped.stop_reason.clone());
                }
            }
            EventData::ModelCallFailed(f) => entries.push(Entry {
                call_index: f.call_index,
                request_hash: f.request_hash.clone(),
                prompt: prompts.remove(&(level.clone(), attempt, f.call)).unwrap_or_default(),
                turns: Vec::new(),
                routing: routed.remove(&level),
                level_id: level,
                provider: f.provider.clone(),
                model: String::new(),
                text: String::new(),
                tool_calls: Vec::new(),
                usage: Usage::default(),
                cost_usd: 0.0,
                error: Some(f.message.clone()),
                stop_reason: None,
            }),
            _ => {}
        }
    }
    Cassette { format: FORMAT, entries, ..Cassette::default() }
}

/// A request the cassette did not hold: where it was asked, and how it differs from the
/// nearest recording (a line diff of the prompt and turns).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Miss {
    pub level_id: String,
    pub call_index: u32,
    pub request_hash: String,
    /// The nearest recording's request hash, when the level has any.
    pub nearest: Option<String>,
    /// `-` recorded, `+` asked.
    pub diff: String,
}

/// Answers from a cassette. The n-th call of a level gets a recording of that level's n-th
/// call for the same request (a job's runs may each hold one: the request picks). A request
/// it does not hold is a [`Miss`], kept for [`Replayer::misses`]: an error, or — with
/// [`Replayer::live`] — a call to the live provider whose answer is recorded
/// ([`Replayer::recorded`]).
#[derive(Debug)]
pub struct Replayer {
    entries: Vec<Entry>,
    /// Which entries answered already: of two recordings of the same request (a failed
    /// call made again, two runs of a job asking alike), each answers once, in order.
    used: Mutex<Vec<bool>>,
    live: Option<Arc<dyn ModelProvider>>,
    misses: Mutex<Vec<Miss>>,
    recorded: Mutex<Vec<Entry>>,
}

impl Replayer {
    /// A replayer over a cassette.
    pub fn new(cassette: Cassette) -> Self {
        Replayer {
            used: Mutex::new(vec![false; cassette.entries.len()]),
            entries: cassette.entries,
            live: None,
            misses: Mutex::new(Vec::new()),
            recorded: Mutex::new(Vec::new()),
        }
    }

    /// Sends the requests the cassette does not hold to `provider`, recording its answers.
    pub fn live(mut self, provider: Arc<dyn ModelProvider>) -> Self {
        self.live = Some(provider);
        self
    }

    /// The requests the cassette did not hold, in the order they were asked.
    pub fn misses(&self) -> Vec<Miss> {
        lock(&self.misses).clone()
    }

    /// The answers the live provider gave for them.
    pub fn recorded(&self) -> Vec<Entry> {
        lock(&self.recorded).clone()
    }

    /// The recording answering `request`; `take` marks it used.
    fn answer(&self, request: &ModelRequest, take: bool) -> Result<&Entry, Miss> {
        let hash = request.hash();
        let mut same_call = self
            .entries
            .iter()
            .filter(|e| e.level_id == request.level_id && e.call_index == request.call_index)
            .peekable();
        {
            let mut used = lock(&self.used);
            let matching: Vec<usize> = (0..self.entries.len())
                .filter(|&i| {
                    let e = &self.entries[i];
                    e.level_id == request.level_id
                        && e.call_index == request.call_index
                        && e.request_hash == hash
                })
                .collect();
            // The first unused recording; when all were used, the first (a request asked
            // more often than recorded gets the same answer).
            if let Some(&i) = matching.iter().find(|&&i| !used[i]).or(matching.first()) {
                used[i] |= take;
                return Ok(&self.entries[i]);
            }
        }
        let asked = transcript(request);
        // The nearest recording: of this call if there is one, else of the level.
        let nearest = if same_call.peek().is_some() {
            same_call.min_by_key(|e| difference(&e.transcript(), &asked).0)
        } else {
            self.entries
                .iter()
                .filter(|e| e.level_id == request.level_id)
                .min_by_key(|e| difference(&e.transcript(), &asked).0)
        };
        Err(Miss {
            level_id: request.level_id.clone(),
            call_index: request.call_index,
            request_hash: hash,
            nearest: nearest.map(|e| e.request_hash.clone()),
            diff: nearest
                .map_or_else(String::new, |e| crate::textdiff::lines(&e.transcript(), &asked)),
        })
    }
}

impl Miss {
    /// The miss as one error message, with the diff.
    pub fn message(&self) -> String {
        let head = format!(
            "no recording for level `{}`, request {} (call {})",
            self.level_id,
            short(&self.request_hash),
            self.call_index
        );
        match &self.nearest {
            Some(n) => format!(
                "{head}; the nearest recording ({}) differs (- recorded, + asked):\n{}",
                short(n),
                self.diff
            ),
            None => format!("{head}; the cassette has no recording for level `{}`", self.level_id),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// How far apart two prompts are (characters after their common start), and where they
/// first differ.
fn difference(a: &str, b: &str) -> (usize, usize) {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let distance = a.chars().count().max(b.chars().count()) - at;
    (distance, at)
}

impl ModelProvider for Replayer {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let miss = match self.answer(request, true) {
                Ok(e) => {
                    if let Some(message) = &e.error {
                        return Err(ModelError::Failed {
                            provider: e.provider.clone(),
                            message: message.clone(),
                            refused: e.stop_reason.as_deref() == Some(STOP_REFUSAL),
                        });
                    }
                    return Ok(ModelReply {
                        provider: e.provider.clone(),
                        model: e.model.clone(),
                        text: e.text.clone(),
                        tool_calls: e.tool_calls.clone(),
                        usage: e.usage,
                        cost_usd: e.cost_usd,
                        routing: e.routing.clone(),
                        stop_reason: e.stop_reason.clone(),
                        failovers: Vec::new(),
                    });
                }
                Err(miss) => miss,
            };
            lock(&self.misses).push(miss.clone());
            let Some(live) = &self.live else {
                return Err(ModelError::Failed {
                    provider: "cassette".to_owned(),
                    message: miss.message(),
                    refused: false,
                });
            };
            let reply = live.call(request, cancel).await?;
            lock(&self.recorded).push(Entry::of(request, &reply));
            Ok(reply)
        })
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        match (self.answer(request, false), &self.live) {
            (Ok(e), _) => e.cost_usd,
            (Err(_), Some(live)) => live.worst_case_cost_usd(request),
            (Err(_), None) => 0.0,
        }
    }

    fn reaches_out(&self, request: &ModelRequest) -> bool {
        match (self.answer(request, false), &self.live) {
            (Ok(_), _) | (Err(_), None) => false,
            (Err(_), Some(live)) => live.reaches_out(request),
        }
    }
}

/// The user's tools answered from a recording, for a replay or a fixture's test: each call
/// gets what the recorded call of the same tool, level and arguments answered (in the
/// order they were made), and an MCP tool the description and schema its server listed.
/// Nothing is called: a call the recording does not hold is an error result that says so.
#[derive(Debug)]
pub struct RecordedTools {
    listed: BTreeMap<String, crate::tools::Listed>,
    answers: Mutex<Vec<ToolEntry>>,
}

impl RecordedTools {
    pub fn new(cassette: &Cassette) -> Self {
        let listed = cassette
            .listed
            .iter()
            .map(|t| {
                let listed = crate::tools::Listed {
                    description: t.description.clone(),
                    schema: t.schema.clone(),
                    read_only_hint: false,
                };
                (t.name.clone(), listed)
            })
            .collect();
        RecordedTools { listed, answers: Mutex::new(cassette.tools.clone()) }
    }
}

/// One attempt's view of the recording.
#[derive(Debug)]
struct RecordedSession(Arc<RecordedTools>);

impl crate::tools::ToolHost for Arc<RecordedTools> {
    fn open<'a>(
        &'a self,
        _tools: &'a [Arc<baton_scenario::model::OwnTool>],
        _workspace: &'a std::path::Path,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Box<dyn crate::tools::ToolSession>> {
        let session = RecordedSession(Arc::clone(self));
        Box::pin(async move { Box::new(session) as Box<dyn crate::tools::ToolSession> })
    }
}

impl crate::tools::ToolSession for RecordedSession {
    fn listed(&self) -> &BTreeMap<String, crate::tools::Listed> {
        &self.0.listed
    }

    fn problems(&self) -> &[String] {
        &[]
    }

    fn call<'a>(
        &'a self,
        call: crate::tools::OwnCall<'a>,
        _cancel: &'a CancelToken,
    ) -> BoxFuture<'a, crate::workspace::ToolOutcome> {
        let mut answers = self.0.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let found = answers.iter().position(|a| {
            a.level_id == call.level_id
                && a.tool == call.tool.name
                && &a.arguments == call.arguments
        });
        let outcome = match found.map(|at| answers.remove(at)) {
            Some(a) => crate::workspace::ToolOutcome {
                content: a.content,
                is_error: a.is_error,
                created: None,
            },
            None => crate::workspace::ToolOutcome::error(format!(
                "not called: the recording holds no call of `{}` by level `{}` with these arguments",
                call.tool.name, call.level_id
            )),
        };
        Box::pin(async move { outcome })
    }
}
