//! The payloads of events: one struct per kind (and the values they carry), as today's
//! schema version writes them.

use baton_scenario::expr::Semantics;
pub use baton_scenario::model::ErrorKind;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalStatus {
    Completed,
    Aborted,
    Cancelled,
    Failed,
}

impl FinalStatus {
    /// The status as written.
    pub fn as_str(self) -> &'static str {
        match self {
            FinalStatus::Completed => "completed",
            FinalStatus::Aborted => "aborted",
            FinalStatus::Cancelled => "cancelled",
            FinalStatus::Failed => "failed",
        }
    }
}

/// Caps copied from the scenario when the run starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetCaps {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_duration_s: Option<f64>,
    /// Most level executions the run may start (`budget.max_level_runs`); absent, the
    /// default [`crate::limits::LEVEL_RUNS_MAX`]. Left out of the payload when absent, so
    /// logs written before it existed hash as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_level_runs: Option<u32>,
    /// The most the run and every run it starts may cost together (a job's
    /// `--max-cost-usd`, or the slice a parent reserved for a child): what its children may
    /// spend is reserved from it. Left out when the tree has no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_max_cost_usd: Option<f64>,
}

impl BudgetCaps {
    /// The most level executions the run may start.
    pub fn level_runs_max(&self) -> u32 {
        self.max_level_runs.unwrap_or(crate::limits::LEVEL_RUNS_MAX)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioStarted {
    pub scenario_id: String,
    pub scenario_version: u32,
    pub checksum: String,
    pub input: String,
    pub metadata: serde_json::Map<String, Value>,
    pub budget: BudgetCaps,
    pub max_attempts_per_conflict: u32,
    /// Where the model answers come from when it is not the configured providers, e.g.
    /// `script:PATH` for the scripted model; a later process resumes with the same.
    pub model_source: Option<String>,
    /// The run's workspace, when the scenario edits one (it has a `tool_loop` level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceInfo>,
    /// The rule the run's gates are evaluated under, for its whole life: a run resumed
    /// by a later build keeps the rule it started with.
    pub gate_semantics: Semantics,
    /// The run that started this one, when it is a child run. Left out for a job's root,
    /// so logs from before child runs hash as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// The tenant whose overrides were merged into the scenario (its checksum is the
    /// merged one's). Left out for a run of no tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Whether a failed attempt is routed by its level's edges (`level.X.failed`,
    /// `level.X.error.kind`, `attempt`) before it fails the run, and a gate-driven retry
    /// recorded (`retry_attempted`). Runs started before that rule keep failing at once
    /// and record no retries; left out when false, so their logs hash as they did.
    #[serde(default, skip_serializing_if = "is_false")]
    pub failures_routed: bool,
    /// The process that started the run (`baton worker NAME (host:pid)`, `host:pid`): its
    /// first driver, named by a takeover. Left out of logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// Whether `b` is false (for fields left out of a record when false).
#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_false(b: &bool) -> bool {
    !b
}

/// Where a child run hangs in its tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParentLink {
    pub parent_run_id: String,
    /// The job's first run, the root of the tree.
    pub root_run_id: String,
    /// The parent's level that started the child, when a level did (a chain starts from
    /// the parent's end, after its last level).
    pub level_id: Option<String>,
    /// The child's name in its parent (`chain`, …): with the parent's id it makes the
    /// child's id.
    pub link: String,
    /// Chain hops from the root to this run (the root is 0).
    pub depth: u32,
}

/// Where a run's workspace is and how it was before the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceInfo {
    pub dir: String,
    /// The snapshot taken before the run changed anything; a cancelled run goes back to it.
    pub base: String,
    /// The branch a completed run's result is committed on, when the user named one.
    pub branch: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelStarted {
    pub role: String,
    pub kind: String,
    /// The fan-out level this one runs under, if any.
    pub parent: Option<String>,
    /// The level's effective `model.allow` (its own, else the scenario's default); empty
    /// when any model may serve it. Absent only from logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_constraint_allow: Option<Vec<String>>,
    /// The process that starts it, when it is not the one the log last names as driving
    /// the run (a worker's first level of a queued run): a takeover names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// Work passes from one role to another: recorded after `level_started` of a level that
/// declares `handoff: true`, once per run of that level and never on a retry (a level
/// entered again from itself).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentHandoff {
    /// The role of the level the run came from; `user` for the run's first level.
    pub from_role: String,
    pub to_role: String,
    pub level_id: String,
    pub attempt: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptSent {
    pub template: String,
    /// The system prompt sent before it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub prompt: String,
    /// 0 for the first call of the attempt, then one more per model call (repairs, answers).
    pub call: u32,
    /// The hash of the request, as its answer (`model_response.request_hash`) names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
    /// The most the call can cost, in US dollars (what the budget reserved for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_case_usd: Option<f64>,
}

/// A model call failed for good (`ModelError::Failed`: a refusal, a 4xx, a malformed
/// answer, a script's injected error): the fact a replay answers that call with, recorded
/// before the attempt's end. Its message has been through the redactor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCallFailed {
    /// The call's number in its attempt, as `prompt_sent.call`.
    pub call: u32,
    /// The call's index among the level's calls in the run, as the request carried it.
    pub call_index: u32,
    pub request_hash: String,
    pub provider: String,
    pub message: String,
}

/// Which model answered a call and why; failovers on the way are listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutingDecision {
    pub tier: String,
    pub provider: String,
    pub model: String,
    /// `allow`, `fallback` or `default`: which part of the policy chose it.
    pub source: String,
    /// Providers tried first that failed, with why.
    pub failovers: Vec<String>,
}

/// Tokens of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// Input and output together.
    pub fn total(self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    pub provider: String,
    pub model: String,
    pub request_hash: String,
    pub call: u32,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub cost_usd: f64,
}

/// Why the model's answer of call `call` ended, when it did not end on its own: recorded
/// right after its `model_response` (a new kind, so `model_response` keeps its schema).
/// `max_tokens` means the answer was cut at the output limit; such an answer never counts
/// as a success.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelStopped {
    pub call: u32,
    /// `max_tokens`, `content_filter`, or what else the provider reported.
    pub stop_reason: String,
}

/// A model call cut short before its answer was whole — by a cancel, the level's
/// `timeout_s` or `max_duration_s` — and what it spent: the prompt was sent and part of the
/// answer streamed, so it is paid for. Tokens are estimated from what was sent and received
/// when the provider reported none. It counts in the totals and budgets like a
/// `model_response`, but is not an answer (the call is not numbered as one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCallCut {
    pub provider: String,
    pub model: String,
    /// Bytes of the answer received before the cut.
    pub streamed_bytes: u64,
    pub usage: Usage,
    pub cost_usd: f64,
}

/// One provider of a level's chain failed after its retries and the call moved on to the
/// next: one event per failover, before the `routing_decision` of the model that answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderFailover {
    pub provider: String,
    pub model: String,
    /// Why it failed, as the client reported it.
    pub reason: String,
}

/// The model client retried a request to one provider after a transient fault (429, 5xx,
/// a timeout, a dropped stream): one event per retry, before the call's answer or failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderRetry {
    pub provider: String,
    pub model: String,
    /// The attempt that failed (1 for the first request).
    pub attempt: u32,
    /// Why it failed.
    pub reason: String,
    /// How long the client waited before the next attempt.
    pub wait_ms: u64,
}

/// A model asked a tool-loop level to run a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCalled {
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
}

/// What a tool returned to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub tool: String,
    pub content: String,
    pub is_error: bool,
}

/// A tool created a file in the workspace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileCreated {
    /// Relative to the workspace, `/`-separated.
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifierStarted {
    pub name: String,
    pub uses: String,
}

/// What a verifier concluded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifierFinished {
    pub name: String,
    pub passed: bool,
    pub score: Option<f64>,
    pub reasons: Vec<String>,
    pub cost_usd: f64,
    pub duration_ms: u64,
    pub details: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AskUser {
    pub call_id: String,
    pub question: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserAnswered {
    pub call_id: String,
    pub answer: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    pub request_id: String,
    pub approver_role: String,
    pub question: String,
    pub schema: Value,
    /// When the request times out (the level's `timeout_s` after it was made): the first
    /// driver that sees the run after it records the decision as timed out, and a decision
    /// that arrives later is refused. Left out when the level has no timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The call of a user's tool that waits for this decision before it is made (a tool
    /// loop's request; a `human_approval` level's has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Box<ToolCallAsked>>,
}

/// The call of a user's tool an approval request is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallAsked {
    pub call_id: String,
    pub tool: String,
    pub toolset: String,
    pub arguments: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecided {
    pub request_id: String,
    pub approved: bool,
    pub comment: Option<String>,
    pub by: Option<String>,
    /// The approver's data for the level's `output_schema`, validated before it was
    /// recorded. Required in the payload (null when none was given): a version 1 payload,
    /// which has no such field, is read through [`v1::ApprovalDecided`].
    #[serde(deserialize_with = "Option::deserialize")]
    pub data: Option<Value>,
    /// Nobody decided before the request's deadline: recorded by the driver that saw it
    /// past, as a rejection (`approved: false`); its level reads `timed_out`. Left out
    /// when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelFinished {
    /// The level ran to a result (a FAIL verdict is still ok); false on an error.
    pub ok: bool,
    pub skipped: bool,
    pub verdict: Option<String>,
    pub output: String,
    pub parsed: Option<Value>,
    pub confidence: Option<f64>,
    /// Scratchpad writes (a null value removes the key): feedback for the next attempt,
    /// summaries for later levels.
    pub scratchpad: serde_json::Map<String, Value>,
    /// The escalation-tracker conflict this result counts a failure on.
    pub conflict: Option<String>,
    pub error: Option<String>,
    /// How the attempt failed, when it did — an error, a timeout, a failed check: what
    /// `level.X.error.kind` reads. Left out of a result that did not fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    pub cost_usd: f64,
    pub tokens: u64,
    pub duration_ms: u64,
    pub terminal: bool,
    /// The workspace paths a tool-loop level's write tools changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub touched_paths: Vec<String>,
    /// The workspace snapshot taken when a tool-loop level finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl LevelFinished {
    /// The result of a level that could not run to a result, failed in a way edges route.
    pub fn failed_as(kind: ErrorKind, message: String, duration_ms: u64) -> LevelFinished {
        LevelFinished { error_kind: Some(kind), ..LevelFinished::failed(message, duration_ms) }
    }

    /// The result of a level that could not run to a result, for a reason no edge routes
    /// (a template that does not render, a level that cannot run here): the run fails.
    pub fn failed(message: String, duration_ms: u64) -> LevelFinished {
        LevelFinished {
            ok: false,
            skipped: false,
            verdict: None,
            output: String::new(),
            parsed: None,
            confidence: None,
            scratchpad: serde_json::Map::new(),
            conflict: None,
            error: Some(message),
            error_kind: None,
            cost_usd: 0.0,
            tokens: 0,
            duration_ms,
            terminal: false,
            touched_paths: Vec::new(),
            snapshot: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateDecision {
    pub source: String,
    pub target: String,
    pub expression: Option<String>,
    pub readings: Vec<Reading>,
    /// No edge matched and the run falls through to the end.
    pub fallthrough: bool,
}

/// One value a gate read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    pub path: String,
    pub value: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetConsumed {
    pub total_cost_usd: f64,
    pub total_tokens: u64,
    pub total_duration_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    /// `cost`, `tokens` or `duration`.
    pub limit_kind: String,
    pub limit_value: f64,
    pub observed_value: f64,
    /// True when a model call was refused before it was made because its worst case would
    /// cross the cap.
    pub refused_before_call: bool,
}

/// An attempt of a level ran past its `timeout_s` and was cut: its model stream dropped,
/// its processes killed. Written just before the attempt's `level_finished` (not ok, its
/// `conflict` naming the timeout, so the escalation tracker counts it); gates read it as
/// `level.<id>.timed_out`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelTimedOut {
    /// The level's `timeout_s`, in milliseconds.
    pub timeout_ms: u64,
    /// How long the attempt ran, cut included.
    pub elapsed_ms: u64,
}

/// A long step is still running (written every few seconds while it does, so that a
/// watcher sees progress); it changes nothing in the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// How long the step has been running.
    pub elapsed_ms: u64,
    /// Bytes of model answers streamed in so far during the step.
    #[serde(default)]
    pub streamed_bytes: u64,
    /// Tool calls the step has run so far.
    #[serde(default)]
    pub tool_calls: u64,
}

/// A gate sent a level back to itself: the level runs another attempt (correx's
/// `RetryAttempted`, bounded by the gate and `budget.max_level_runs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryAttempted {
    /// The level run again.
    pub level: String,
    /// The attempt about to begin (2 for the first retry).
    pub attempt: u32,
    /// Why the last attempt is retried: how it failed, or the gate that sent it back.
    pub reason: String,
}

/// A level is asked again within its attempt because a check failed (`on_fail: retry`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryScheduled {
    /// 1 for the first retry.
    pub retry: u32,
    pub retries_max: u32,
    /// The checks that failed.
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CancelRequested {
    pub by: Option<String>,
    pub reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Warning {
    pub message: String,
}

/// A paused run was moved to the scenario's current version (`baton resume RUN
/// --upgrade`): from here on it continues on `checksum`, whose texts the store keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioUpgraded {
    pub from_version: u32,
    pub from_checksum: String,
    pub version: u32,
    pub checksum: String,
}

/// `run_interrupted.cause` when every model a level may use was unavailable.
pub const CAUSE_UNAVAILABLE: &str = "provider_unavailable";
/// `run_interrupted.cause` when the workspace failed for a reason that passes (its lock
/// held, git killed or out of time).
pub const CAUSE_WORKSPACE: &str = "workspace";
/// `run_interrupted.cause` when the driver was stopped by SIGINT or SIGTERM.
pub const CAUSE_SIGNAL: &str = "signal";

/// The run stopped without ending: its driver gave up on a transient fault (every model of
/// a level's chain unavailable after its retries) or was stopped (SIGINT, SIGTERM). The
/// level in flight keeps its attempt; the log is whole, and `baton resume` continues the
/// run (recorded as `run_resumed`). A run whose driver died writes nothing: it is seen as
/// interrupted because nobody holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInterrupted {
    /// `provider_unavailable`, `workspace` or `signal`.
    pub cause: String,
    pub reason: String,
}

/// A driver continued an interrupted run: the interrupted attempt runs again from its
/// start (a tool loop from its last snapshot), with the same attempt number — an outage is
/// not the level's failure, so it counts on no tracker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResumed {
    /// Why the run had stopped: what `run_interrupted` said, or the `reason` of the
    /// `run_paused` it ends (`approval`, `question`, `driver_lost`).
    pub after: String,
    /// The how-many-th resume of the run this is (1 for the first).
    pub resumes: u32,
    /// Who let the run go on: the person whose decision ended a wait, `takeover` when a
    /// process took over a run whose driver was lost, `driver` when a process continued
    /// an interrupted run. Absent from logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The process that drives the run on (`baton worker NAME (host:pid)`, `host:pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// A process took over a run whose driver was lost (killed, its lease run out) while a
/// level ran: who held it, who takes it, and what the lost driver left unfinished.
/// Recorded between the `run_paused` (`driver_lost`) and the `run_resumed` (by
/// `takeover`) of the takeover.
///
/// A model call whose `prompt_sent` was committed and which has no answer in the log was
/// sent, and a provider bills it whether or not its answer arrived: the takeover counts
/// each at the worst case the call reserved, against the run's totals and budget, once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunTakenOver {
    /// The process the log last names as driving the run (its start's, a resumption's or
    /// an earlier takeover's), when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The process that takes it over.
    pub by: String,
    /// The level that was in flight, and its attempt.
    pub level_id: String,
    pub attempt: u32,
    /// The model calls that were sent and never answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<CutCall>,
    /// What the run's totals take for them: the sum of their worst cases (a call that
    /// recorded none counts nothing, and is listed all the same).
    pub charged_usd: f64,
    /// The snapshot the level's attempt goes on from, when the run has a workspace: the
    /// last level boundary's (fetched from the hand-off store on another host); the edits
    /// the lost driver made after it and did not commit are made again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts_from: Option<String>,
}

/// A model call a lost driver sent and never saw answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CutCall {
    pub level_id: String,
    pub attempt: u32,
    /// Its number in its attempt (`prompt_sent.call`).
    pub call: u32,
    /// The most it can cost, as its `prompt_sent` recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_case_usd: Option<f64>,
}

/// The run stopped being driven without ending: it waits for a person (`approval`,
/// `question`), or its driver stopped (`interrupted`, beside `run_interrupted`) or was
/// lost (`driver_lost`, recorded by the process that takes the run over, just before its
/// `run_resumed`). Every pause is followed by one `run_resumed` when the run goes on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPaused {
    /// `approval`, `question`, `interrupted` or `driver_lost`.
    pub reason: String,
    /// What it waits for or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// [`RunPaused::reason`] of a run waiting for an approval.
pub const PAUSE_APPROVAL: &str = "approval";
/// [`RunPaused::reason`] of a run waiting for an answer.
pub const PAUSE_QUESTION: &str = "question";
/// [`RunPaused::reason`] of a run whose driver stopped (`run_interrupted`).
pub const PAUSE_INTERRUPTED: &str = "interrupted";
/// [`RunPaused::reason`] of a run whose driver was lost without a word.
pub const PAUSE_DRIVER_LOST: &str = "driver_lost";
/// [`RunResumed::by`] of a run a process continued after an interruption.
pub const RESUMED_BY_DRIVER: &str = "driver";
/// [`RunResumed::by`] of a run a process took over from a driver that was lost.
pub const RESUMED_BY_TAKEOVER: &str = "takeover";

/// Totals of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub cost_usd: f64,
    pub tokens: u64,
    /// Time drivers worked on the run.
    pub duration_ms: u64,
    pub levels_run: u32,
    /// Time the run waited for a person (approvals, answers), apart from `duration_ms`.
    /// Left out when zero, so logs from before it hash as they did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting_ms: u64,
}

impl Totals {
    /// Both totals added, field by field.
    #[must_use]
    pub fn plus(self, other: Totals) -> Totals {
        Totals {
            cost_usd: self.cost_usd + other.cost_usd,
            tokens: self.tokens + other.tokens,
            duration_ms: self.duration_ms + other.duration_ms,
            levels_run: self.levels_run + other.levels_run,
            waiting_ms: self.waiting_ms + other.waiting_ms,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioFinished {
    pub status: FinalStatus,
    pub aborted_reason: Option<String>,
    pub totals: Totals,
    pub checksum: String,
    pub final_output: Option<String>,
    /// The run's totals with those of every child run it settled (and theirs): what the
    /// whole tree below it spent. Left out for a run that started no child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_totals: Option<Totals>,
}

/// How a job's scenario was chosen (000 §2): recorded right after `scenario_started` on a
/// job's first run, with what the job asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioSelected {
    pub scenario_id: String,
    /// `pin`, `intent`, `classifier`, `default` or `fallback`.
    pub how: String,
    /// The pin the job named, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
    /// The intent route the job named, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// The job's kind (`task`, `question`, …), if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Why the job did not get what it asked for (an unknown route fell back to the
    /// default), when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The run's result named an intent route (`chosen_intent_route`): the job goes on in the
/// scenario that owns it, as a child run of this one (002's chain primitive).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioChained {
    pub from: String,
    pub to: String,
    /// The route as the level's output gave it (empty when it gave none usable).
    pub route: String,
    /// The level whose output named the route.
    pub level_id: String,
    /// The child's hops from the job's root (1 for the first chain).
    pub depth: u32,
    /// Why the job went to the fallback scenario instead, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// A child run is about to exist: recorded before it is created, with everything it
/// starts from, so that a crash between the two can never start it twice (the next driver
/// creates it from this event, under the same id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildRunStarted {
    pub child_run_id: String,
    pub link: String,
    pub scenario_id: String,
    pub scenario_version: u32,
    pub checksum: String,
    pub input: String,
    pub metadata: serde_json::Map<String, Value>,
    /// The child's caps: its scenario's, narrowed to the slice of the tree's cost cap
    /// reserved for it.
    pub budget: BudgetCaps,
    pub depth: u32,
}

/// A child run ended and its parent took its result, exactly once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildRunSettled {
    pub child_run_id: String,
    pub link: String,
    pub status: FinalStatus,
    pub aborted_reason: Option<String>,
    pub final_output: Option<String>,
    /// The child's own totals.
    pub totals: Totals,
    /// The child's tree: its totals with its own children's.
    pub tree_totals: Totals,
}

/// This run re-executes a recorded run: model answers come from the recording's log, and
/// its verifiers ran again or had their recorded outcomes trusted. Written once, right
/// after `scenario_started` (and the job's `scenario_selected`); it is the replay's own
/// record, left out when its log is compared with the recording's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReplayed {
    /// The recorded run (a fixture's, for `baton test`).
    pub of_run_id: String,
    pub strategy: Strategy,
    /// Where the recording was read: `store` (this database) or `fixture:DIR`.
    pub source: String,
    /// The checksum of the scenario the recording ran, when the replay runs another
    /// version (`--from-scenario`, or `baton test` on edited files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_checksum: Option<String>,
}

/// This run is a fork: its events before this one are another run's first `at_seq`, copied
/// with their times; this is its first own event, with what the fork changed. Folded, it
/// replaces the input, writes the scratchpad keys, moves the run to another version of its
/// scenario, and gives the run a workspace of its own restored to the snapshot the copied
/// events reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunForked {
    pub from_run_id: String,
    pub at_seq: u64,
    /// The new input, when the fork changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Scratchpad keys the fork sets (null removes one).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub scratchpad: serde_json::Map<String, Value>,
    /// The scenario version the fork runs on, when it is not the copied run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<ScenarioUpgraded>,
    /// The fork's own workspace (its `base` the copied run's), when the run has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceInfo>,
    /// The snapshot the fork's workspace was restored to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<String>,
    /// Where the fork's model answers come from, when not the configured providers (a
    /// later process resumes the fork with the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_source: Option<String>,
}

/// A level wrote a note to the run's scratchpad (a tool loop's `scratchpad_put`, a JSON
/// answer's `scratchpad` object); null removes the key. Gates and later levels read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScratchpadWritten {
    pub key: String,
    pub value: Value,
}

/// A child run did not end within the settle timeout of its parent's end: the parent ends
/// without its result, and says so.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildRunUnsettled {
    pub child_run_id: String,
    pub link: String,
    /// The child's status when the parent stopped waiting.
    pub status: String,
    pub waited_ms: u64,
}

/// A tool call a model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id of the call, which its result must name.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// How a replay treats verifiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Every verifier runs again on the replayed output (the default).
    #[default]
    RerunVerifiers,
    /// A verifier's recorded outcome is taken as it was, and no program runs; a judge's
    /// model answer still comes from the log, like every model answer.
    TrustValidation,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::RerunVerifiers => "rerun_verifiers",
            Strategy::TrustValidation => "trust_validation",
        }
    }
}
