//! Models, as the kernel sees them: the [`ModelProvider`] trait, and the scripted model.
//!
//! The scripted model answers from a YAML script — per level, an ordered list of
//! responses (text, tool calls, usage and cost, an optional delay, or an injected error) —
//! so every scenario runs offline and deterministically. Which response a call gets
//! depends only on the log: the n-th call a level makes in a run gets the n-th entry (the
//! last entry repeats once the list is exhausted).

use std::collections::BTreeMap;
use std::time::Duration;

use baton_scenario::de::{Located, from_node};
use baton_scenario::model::ModelConstraint;
use baton_scenario::node::Node;
use baton_scenario::source::SourceId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::cancel::CancelToken;
pub use crate::event::ToolCall;
use crate::event::Usage;
pub use crate::future::BoxFuture;
use crate::limits;

/// One call to a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelRequest {
    /// The scenario of the run making the call (a job's runs have several). Not part of
    /// the request's content (nor its hash).
    pub scenario_id: String,
    pub level_id: String,
    /// How many calls this level made before this one, in the whole run.
    pub call_index: u32,
    /// Standing instructions sent before the prompt (a system prompt), when the level has
    /// them.
    pub system: Option<String>,
    pub prompt: String,
    /// `json` when the level expects a JSON answer.
    pub json: bool,
    /// The JSON Schema the answer must match, when the level declares one; providers that
    /// can constrain their output to it do.
    pub schema: Option<Value>,
    pub max_tokens: u32,
    pub constraint: Option<ModelConstraint>,
    /// The conversation after the prompt (a tool loop's earlier turns), oldest first.
    pub turns: Vec<Turn>,
    /// The tools the model may call natively; empty for a plain call.
    pub tools: Vec<ToolSpec>,
    /// When the attempt making the call must be done (its level's `timeout_s`, the run's
    /// `max_duration_s`): a client waits no longer for an answer, and retries no later.
    /// Not part of the request's content (nor its hash).
    pub deadline: Option<std::time::Instant>,
}

/// A tool's result, sent back to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolReply {
    pub call_id: String,
    pub name: String,
    pub content: String,
    pub is_error: bool,
}

/// One message of a conversation after its first prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Turn {
    /// What the model said: text, and the tools it called.
    Assistant { text: String, tool_calls: Vec<ToolCall> },
    /// The results of the tools the model called in its last turn.
    Tools { results: Vec<ToolReply> },
    /// A user message (the textual tool protocol's results, a nudge).
    User { text: String },
}

/// A tool a model may call: its name, what it does and its arguments' JSON Schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

impl ModelRequest {
    /// The sampling temperature the level's constraint sets.
    pub fn temperature(&self) -> Option<f64> {
        self.constraint.as_ref().and_then(|c| c.temperature)
    }

    /// Characters of everything the model reads, for token estimates.
    pub fn input_chars(&self) -> usize {
        let turns: usize = self
            .turns
            .iter()
            .map(|t| match t {
                Turn::Assistant { text, tool_calls } => {
                    text.len()
                        + tool_calls.iter().map(|c| c.arguments.to_string().len()).sum::<usize>()
                }
                Turn::Tools { results } => results.iter().map(|r| r.content.len()).sum(),
                Turn::User { text } => text.len(),
            })
            .sum();
        self.system.as_ref().map_or(0, String::len) + self.prompt.len() + turns
    }

    /// The sha256 of the request's content (not its position in the run).
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        if let Some(system) = &self.system {
            h.update(b"system\0");
            h.update(system.as_bytes());
            h.update(b"\0");
        }
        h.update(self.prompt.as_bytes());
        h.update([u8::from(self.json)]);
        if let Some(schema) = &self.schema {
            h.update(schema.to_string().as_bytes());
        }
        h.update(self.max_tokens.to_le_bytes());
        if let Some(t) = self.temperature() {
            h.update(t.to_le_bytes());
        }
        if !self.turns.is_empty() || !self.tools.is_empty() {
            // Serialising these types cannot fail: no maps with non-string keys.
            h.update(serde_json::to_string(&self.turns).unwrap_or_default().as_bytes());
            h.update(serde_json::to_string(&self.tools).unwrap_or_default().as_bytes());
        }
        baton_scenario::check::hex(&h.finalize())
    }
}

/// The stop reason of an answer cut at the output limit (OpenAI's `length`, Anthropic's
/// `max_tokens`), as providers report it to the engine.
pub const STOP_MAX_TOKENS: &str = "max_tokens";

/// The stop reason of a refusal, as a cassette records a refused call.
pub const STOP_REFUSAL: &str = "refusal";

/// A model's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelReply {
    pub provider: String,
    pub model: String,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub cost_usd: f64,
    /// How the model was chosen, when a policy chose it (recorded as `routing_decision`).
    pub routing: Option<crate::event::RoutingDecision>,
    /// Why the answer ended, when not on its own (`max_tokens`: cut at the output limit);
    /// `None` for a normal end or when the provider does not say.
    pub stop_reason: Option<String>,
    /// The providers of the chain that failed before this one answered, in order.
    pub failovers: Vec<crate::event::ProviderFailover>,
}

/// Why a call produced no answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// A permanent failure: the request or the configuration is wrong (an auth error, a
    /// 400, a refusal, a malformed answer); trying again will not help.
    #[error("model call failed ({provider}): {message}")]
    Failed {
        provider: String,
        message: String,
        /// The model refused to answer (every model the call tried refused).
        refused: bool,
    },
    /// A transient failure: every model the level may use failed with faults that pass
    /// (429, 5xx, timeouts, dropped connections, overloaded streams) after its retries.
    /// The run stops without ending, to be resumed.
    #[error("every model is unavailable ({provider}): {message}")]
    Unavailable { provider: String, message: String },
    #[error("model call cancelled")]
    Cancelled,
}

/// Something that answers model requests.
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Calls the model; resolves early with [`ModelError::Cancelled`] when `cancel` fires.
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>>;

    /// The most this request can cost (prompt tokens plus `max_tokens` at the model's
    /// price), for the budget check made before the call.
    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64;

    /// Whether this call leaves the process (an HTTP provider's): then the engine commits
    /// its `prompt_sent` — with the send time, the request hash and the worst case — before
    /// sending it, so a call in flight is in the log even if the process dies during it.
    /// An answer found locally (a script, a cassette) needs no record ahead of it.
    fn reaches_out(&self, _request: &ModelRequest) -> bool {
        true
    }
}

/// A scripted model: answers from a YAML script, offline and deterministic.
///
/// A script answers one scenario per level (`levels:`), or a whole job — every scenario
/// its runs go through — per scenario and level (`scenarios: {ID: {levels: …, default:
/// …, cases: [{when: TEXT, levels: …}]}}`); the first case whose text the prompt holds
/// comes first, then the scenario's own entries, then the top-level ones, then the
/// scenario's `default`, then the top-level `default`.
#[derive(Clone, Debug, Default)]
pub struct ScriptedModel {
    levels: BTreeMap<String, Vec<ScriptedResponse>>,
    default: Option<ScriptedResponse>,
    scenarios: BTreeMap<String, ScriptedScenario>,
}

/// One scenario's answers in a job's script.
#[derive(Clone, Debug, Default)]
struct ScriptedScenario {
    levels: BTreeMap<String, Vec<ScriptedResponse>>,
    default: Option<ScriptedResponse>,
    /// Answers for the calls whose prompt holds a text (a wave's workers of one scenario
    /// told apart by their assignment), tried before the scenario's own.
    cases: Vec<ScriptedCase>,
}

/// Answers for the calls whose prompt contains `when`.
#[derive(Clone, Debug, Default)]
struct ScriptedCase {
    when: String,
    levels: BTreeMap<String, Vec<ScriptedResponse>>,
}

/// One scripted answer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedResponse {
    /// The answer's text.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls, for tool-loop levels.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// Token counts; estimated from the text when absent.
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
    /// Cost of the call in US dollars (default 0).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The most the call may cost, as the budget check before it sees it (default: its
    /// `cost_usd`).
    #[serde(default)]
    pub worst_case_usd: Option<f64>,
    /// Wait this long before answering (a cancel cuts the wait short).
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Fail the call with this message instead of answering.
    #[serde(default)]
    pub error: Option<String>,
    /// Fail the call as a refusal: the model declined to answer, for this reason.
    #[serde(default)]
    pub refusal: Option<String>,
    /// Fail the call as an outage with this message: every model unavailable after its
    /// retries, a transient fault that leaves the run interrupted and resumable.
    #[serde(default)]
    pub unavailable: Option<String>,
    /// Why the answer ended, as a provider reports it (`max_tokens`: cut at the output
    /// limit); a normal end when absent.
    #[serde(default)]
    pub stop_reason: Option<String>,
}

/// A scripted tool call; its id defaults to `call_<call index>_<position>`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// Scripted token counts.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript {
    #[serde(default)]
    levels: BTreeMap<String, Located<Vec<Located<ScriptedResponse>>>>,
    #[serde(default)]
    default: Option<Located<ScriptedResponse>>,
    /// Answers per scenario, for a job whose runs go through several.
    #[serde(default)]
    scenarios: BTreeMap<String, RawScenarioScript>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenarioScript {
    #[serde(default)]
    levels: BTreeMap<String, Located<Vec<Located<ScriptedResponse>>>>,
    #[serde(default)]
    default: Option<Located<ScriptedResponse>>,
    /// Answers for calls whose prompt contains a text, tried first, in order.
    #[serde(default)]
    cases: Vec<RawCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    when: Located<String>,
    levels: RawLevels,
}

type RawLevels = BTreeMap<String, Located<Vec<Located<ScriptedResponse>>>>;

/// Checks one set of scripted levels and its default; `whose` names the scenario in
/// messages (empty for the top level).
fn check_levels(
    file: &str,
    whose: &str,
    levels: &RawLevels,
    default: Option<&Located<ScriptedResponse>>,
) -> Result<(), String> {
    for (level, list) in levels {
        if list.value.is_empty() {
            return Err(format!(
                "{file}:{}:{}: {whose}level `{level}` has an empty list of responses",
                list.pos.line, list.pos.col
            ));
        }
        for (n, response) in list.value.iter().enumerate() {
            check_response(response).map_err(|message| {
                format!(
                    "{file}:{}:{}: {whose}level `{level}`, response {}: {message}",
                    response.pos.line,
                    response.pos.col,
                    n + 1
                )
            })?;
        }
    }
    if let Some(response) = default {
        check_response(response).map_err(|message| {
            format!(
                "{file}:{}:{}: {whose}the default response: {message}",
                response.pos.line, response.pos.col
            )
        })?;
    }
    Ok(())
}

fn unlocate(levels: RawLevels) -> BTreeMap<String, Vec<ScriptedResponse>> {
    levels.into_iter().map(|(k, v)| (k, v.value.into_iter().map(|r| r.value).collect())).collect()
}

/// Why a scripted response cannot be an answer: a cost must be a finite amount of zero or
/// more (a negative one would make a run report money it earned). Token counts are whole
/// numbers of zero or more by their type.
fn check_response(response: &ScriptedResponse) -> Result<(), String> {
    for (name, amount) in
        [("cost_usd", response.cost_usd), ("worst_case_usd", response.worst_case_usd)]
    {
        if let Some(cost) = amount
            && (!cost.is_finite() || cost < 0.0)
        {
            return Err(format!("{name} must be a finite number of zero or more, not {cost}"));
        }
    }
    Ok(())
}

impl ScriptedModel {
    /// A model that gives every call the same answer.
    pub fn constant(text: impl Into<String>) -> Self {
        ScriptedModel {
            levels: BTreeMap::new(),
            default: Some(ScriptedResponse {
                text: Some(text.into()),
                ..ScriptedResponse::default()
            }),
            scenarios: BTreeMap::new(),
        }
    }

    /// Adds responses for a level, in order.
    #[must_use]
    pub fn with_level(mut self, level: &str, responses: Vec<ScriptedResponse>) -> Self {
        self.levels.insert(level.to_owned(), responses);
        self
    }

    /// Parses a script; errors name the line.
    pub fn parse(text: &str, file: &str) -> Result<Self, String> {
        let node = Node::parse(text, SourceId(0))
            .map_err(|d| format!("{file}:{}:{}: {}", d.line, d.column, d.message))?;
        let raw: RawScript = from_node(&node).map_err(|e| {
            let help = e.help.map(|h| format!(" ({h})")).unwrap_or_default();
            format!("{file}:{}:{}: {}{help}", e.pos.line, e.pos.col, e.message)
        })?;
        check_levels(file, "", &raw.levels, raw.default.as_ref())?;
        for (id, scenario) in &raw.scenarios {
            check_levels(
                file,
                &format!("scenario `{id}`, "),
                &scenario.levels,
                scenario.default.as_ref(),
            )?;
            for case in &scenario.cases {
                if case.when.value.is_empty() {
                    return Err(format!(
                        "{file}:{}:{}: scenario `{id}`, a case's `when` must not be empty",
                        case.when.pos.line, case.when.pos.col
                    ));
                }
                check_levels(
                    file,
                    &format!("scenario `{id}`, case `{}`, ", case.when.value),
                    &case.levels,
                    None,
                )?;
            }
        }
        Ok(ScriptedModel {
            levels: unlocate(raw.levels),
            default: raw.default.map(|r| r.value),
            scenarios: raw
                .scenarios
                .into_iter()
                .map(|(id, s)| {
                    let levels = unlocate(s.levels);
                    let cases = s
                        .cases
                        .into_iter()
                        .map(|c| ScriptedCase { when: c.when.value, levels: unlocate(c.levels) })
                        .collect();
                    (id, ScriptedScenario { levels, default: s.default.map(|r| r.value), cases })
                })
                .collect(),
        })
    }

    fn response(&self, request: &ModelRequest) -> Option<&ScriptedResponse> {
        let index = request.call_index as usize;
        fn nth(list: &[ScriptedResponse], index: usize) -> Option<&ScriptedResponse> {
            list.get(index).or_else(|| list.last())
        }
        let own = self.scenarios.get(&request.scenario_id);
        if let Some(list) = own.and_then(|s| {
            s.cases
                .iter()
                .filter(|c| request.prompt.contains(&c.when))
                .find_map(|c| c.levels.get(&request.level_id))
        }) {
            return nth(list, index);
        }
        if let Some(list) = own.and_then(|s| s.levels.get(&request.level_id)) {
            return nth(list, index);
        }
        if let Some(list) = self.levels.get(&request.level_id) {
            return nth(list, index);
        }
        own.and_then(|s| s.default.as_ref()).or(self.default.as_ref())
    }
}

fn estimate_tokens(text: &str) -> u64 {
    (text.len().div_ceil(limits::CHARS_PER_TOKEN)) as u64
}

impl ModelProvider for ScriptedModel {
    fn call<'a>(
        &'a self,
        request: &'a ModelRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let Some(response) = self.response(request) else {
                return Err(ModelError::Failed {
                    refused: false,
                    provider: "scripted".to_owned(),
                    message: format!(
                        "the script has no response for level `{}` of scenario `{}` and no `default`; add one under `levels: {{{}: [...]}}` (or, for a job, under `scenarios: {{{}: {{levels: …}}}}`)",
                        request.level_id,
                        request.scenario_id,
                        request.level_id,
                        request.scenario_id
                    ),
                });
            };
            if let Some(ms) = response.delay_ms.filter(|ms| *ms > 0) {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    () = cancel.cancelled() => return Err(ModelError::Cancelled),
                }
            }
            if cancel.is_cancelled() {
                return Err(ModelError::Cancelled);
            }
            if let Some(message) = &response.error {
                return Err(ModelError::Failed {
                    provider: "scripted".to_owned(),
                    message: message.clone(),
                    refused: false,
                });
            }
            if let Some(reason) = &response.refusal {
                return Err(ModelError::Failed {
                    provider: "scripted".to_owned(),
                    message: format!("the model refused: {reason}"),
                    refused: true,
                });
            }
            if let Some(message) = &response.unavailable {
                return Err(ModelError::Unavailable {
                    provider: "scripted".to_owned(),
                    message: message.clone(),
                });
            }
            let text = response.text.clone().unwrap_or_default();
            cancel.progress().text(&request.level_id, request.call_index, &text);
            let usage = response.usage.map_or_else(
                || Usage {
                    input_tokens: (request.input_chars().div_ceil(limits::CHARS_PER_TOKEN)) as u64,
                    output_tokens: estimate_tokens(&text),
                },
                |u| Usage { input_tokens: u.input_tokens, output_tokens: u.output_tokens },
            );
            Ok(ModelReply {
                provider: "scripted".to_owned(),
                model: "script".to_owned(),
                text,
                tool_calls: response
                    .tool_calls
                    .iter()
                    .enumerate()
                    .map(|(n, c)| ToolCall {
                        id: c
                            .id
                            .clone()
                            .unwrap_or_else(|| format!("call_{}_{n}", request.call_index)),
                        name: c.name.clone(),
                        arguments: c
                            .arguments
                            .clone()
                            .unwrap_or_else(|| Value::Object(Default::default())),
                    })
                    .collect(),
                usage,
                cost_usd: response.cost_usd.unwrap_or(0.0),
                routing: None,
                stop_reason: response.stop_reason.clone(),
                failovers: Vec::new(),
            })
        })
    }

    fn worst_case_cost_usd(&self, request: &ModelRequest) -> f64 {
        self.response(request).and_then(|r| r.worst_case_usd.or(r.cost_usd)).unwrap_or(0.0)
    }

    fn reaches_out(&self, _request: &ModelRequest) -> bool {
        false
    }
}

/// The key of the arguments that stand in for a call's arguments over the size limits:
/// the call is refused, and neither the log nor the conversation holds them.
pub const OMITTED_KEY: &str = "baton_omitted_argument_bytes";

/// Caps a model turn's tool calls before anything records them: a call whose arguments
/// are over [`limits::TOOL_ARGUMENTS_BYTES_MAX`], or that would take the turn's arguments
/// over [`limits::TURN_ARGUMENTS_BYTES_MAX`], keeps only a note of its size (and is
/// refused when it would run). So one turn adds a bounded number of bytes to the log
/// (the model's text, at most twice the turn's arguments — the `model_response` and the
/// `tool_call` events — and the bounded results) however much a model sends.
pub fn cap_tool_calls<'a>(calls: impl IntoIterator<Item = &'a mut ToolCall>) {
    let mut turn_bytes = 0usize;
    for call in calls {
        let bytes = call.arguments.to_string().len();
        if bytes > limits::TOOL_ARGUMENTS_BYTES_MAX
            || turn_bytes + bytes > limits::TURN_ARGUMENTS_BYTES_MAX
        {
            call.arguments = json!({ OMITTED_KEY: bytes });
        } else {
            turn_bytes += bytes;
        }
    }
}
