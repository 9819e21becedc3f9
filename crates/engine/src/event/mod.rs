//! Events: every fact of a run, numbered from 1.
//!
//! An event is an envelope (`seq`, `at`, `level_id`, `attempt`) around a payload. Payloads
//! are explicit structs, one per kind, with schema version [`VERSION`]; a stored event is
//! decoded by `(kind, version)` so that an old log is upgraded by code, never by a silent
//! serde default. The same stream feeds the CLI, the planner and replay.
//!
//! Versions:
//! - 1: the first schema.
//! - 2: `scenario_started` records `gate_semantics`, the rule the run's gates are
//!   evaluated under. A version-1 `scenario_started` is upgraded to the two-valued rule,
//!   the only one that existed when it was written ([`v1::ScenarioStarted`]); every
//!   other kind is the same in both versions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod late;
pub mod ledger;
pub mod live;
pub mod payloads;
pub mod steering;
pub mod v1;
pub mod wave;

pub use late::{LATE_RESULT_AFTER_CANCEL, LateResultDiscarded};
pub use ledger::{ToolCallFinished, ToolCallReissued, ToolCallStarted, ToolsListed};
pub use live::LiveText;
pub use payloads::*;
pub use steering::{SteeringDelivered, SteeringReceived};
pub use wave::*;

/// Schema version of every payload written today.
///
/// Version 2 added `gate_semantics` to `scenario_started` (a version 1 run keeps the
/// two-valued gates it started under) and `data` to `approval_decided` (the approver's
/// data for the level's `output_schema`; a version 1 decision is upgraded by
/// [`v1::ApprovalDecided`]).
pub const VERSION: u16 = 2;

/// A stored event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    pub seq: u64,
    pub at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(flatten)]
    pub data: EventData,
}

/// An event about to be appended: the store gives it its `seq`, the executor its `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub level_id: Option<String>,
    pub attempt: Option<u32>,
    pub data: EventData,
}

impl NewEvent {
    /// An event of the run as a whole.
    pub fn run(data: EventData) -> Self {
        NewEvent { level_id: None, attempt: None, data }
    }

    /// An event of one attempt of a level.
    pub fn level(level_id: &str, attempt: u32, data: EventData) -> Self {
        NewEvent { level_id: Some(level_id.to_owned()), attempt: Some(attempt), data }
    }

    /// Stamps the event with its number and time.
    pub fn at(self, seq: u64, at: DateTime<Utc>) -> Event {
        Event { seq, at, level_id: self.level_id, attempt: self.attempt, data: self.data }
    }
}

/// The payload of an event; its variant is the event's kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum EventData {
    ScenarioStarted(Box<ScenarioStarted>),
    LevelStarted(LevelStarted),
    PromptSent(PromptSent),
    RoutingDecision(RoutingDecision),
    ModelResponse(ModelResponse),
    ModelStopped(ModelStopped),
    ModelCallFailed(ModelCallFailed),
    ModelCallCut(ModelCallCut),
    ProviderFailover(ProviderFailover),
    ProviderRetry(ProviderRetry),
    ToolCall(ToolCalled),
    ToolResult(ToolResult),
    FileCreated(FileCreated),
    VerifierStarted(VerifierStarted),
    VerifierFinished(VerifierFinished),
    AskUser(AskUser),
    UserAnswered(UserAnswered),
    ApprovalRequested(ApprovalRequested),
    ApprovalDecided(ApprovalDecided),
    LevelFinished(Box<LevelFinished>),
    LevelTimedOut(LevelTimedOut),
    GateDecision(GateDecision),
    BudgetConsumed(BudgetConsumed),
    BudgetExceeded(BudgetExceeded),
    RetryScheduled(RetryScheduled),
    RetryAttempted(RetryAttempted),
    Heartbeat(Heartbeat),
    CancelRequested(CancelRequested),
    Warning(Warning),
    ScenarioFinished(Box<ScenarioFinished>),
    ScenarioUpgraded(ScenarioUpgraded),
    RunInterrupted(RunInterrupted),
    RunResumed(RunResumed),
    RunPaused(RunPaused),
    RunTakenOver(RunTakenOver),
    AgentHandoff(AgentHandoff),
    ScenarioSelected(ScenarioSelected),
    ScenarioChained(ScenarioChained),
    ChildRunStarted(Box<ChildRunStarted>),
    ChildRunSettled(Box<ChildRunSettled>),
    ChildRunUnsettled(ChildRunUnsettled),
    ScratchpadWritten(ScratchpadWritten),
    WavePlanned(WavePlanned),
    WaveDispatched(WaveDispatched),
    WaveRecorded(WaveRecorded),
    WaveDecided(WaveDecided),
    RunReplayed(RunReplayed),
    RunForked(Box<RunForked>),
    SteeringReceived(SteeringReceived),
    SteeringDelivered(SteeringDelivered),
    LateResultDiscarded(LateResultDiscarded),
    ToolCallStarted(ToolCallStarted),
    ToolCallFinished(ToolCallFinished),
    ToolCallReissued(ToolCallReissued),
    ToolsListed(Box<ToolsListed>),
}

impl EventData {
    /// The kind's name as stored.
    pub fn kind(&self) -> &'static str {
        match self {
            EventData::ScenarioStarted(_) => "scenario_started",
            EventData::LevelStarted(_) => "level_started",
            EventData::PromptSent(_) => "prompt_sent",
            EventData::RoutingDecision(_) => "routing_decision",
            EventData::ModelResponse(_) => "model_response",
            EventData::ModelStopped(_) => "model_stopped",
            EventData::ModelCallFailed(_) => "model_call_failed",
            EventData::ModelCallCut(_) => "model_call_cut",
            EventData::ProviderFailover(_) => "provider_failover",
            EventData::ProviderRetry(_) => "provider_retry",
            EventData::ToolCall(_) => "tool_call",
            EventData::ToolResult(_) => "tool_result",
            EventData::FileCreated(_) => "file_created",
            EventData::VerifierStarted(_) => "verifier_started",
            EventData::VerifierFinished(_) => "verifier_finished",
            EventData::AskUser(_) => "ask_user",
            EventData::UserAnswered(_) => "user_answered",
            EventData::ApprovalRequested(_) => "approval_requested",
            EventData::ApprovalDecided(_) => "approval_decided",
            EventData::LevelFinished(_) => "level_finished",
            EventData::LevelTimedOut(_) => "level_timed_out",
            EventData::GateDecision(_) => "gate_decision",
            EventData::BudgetConsumed(_) => "budget_consumed",
            EventData::BudgetExceeded(_) => "budget_exceeded",
            EventData::RetryScheduled(_) => "retry_scheduled",
            EventData::RetryAttempted(_) => "retry_attempted",
            EventData::Heartbeat(_) => "heartbeat",
            EventData::CancelRequested(_) => "cancel_requested",
            EventData::Warning(_) => "warning",
            EventData::ScenarioFinished(_) => "scenario_finished",
            EventData::ScenarioUpgraded(_) => "scenario_upgraded",
            EventData::RunInterrupted(_) => "run_interrupted",
            EventData::RunResumed(_) => "run_resumed",
            EventData::RunPaused(_) => "run_paused",
            EventData::RunTakenOver(_) => "run_taken_over",
            EventData::AgentHandoff(_) => "agent_handoff",
            EventData::ScenarioSelected(_) => "scenario_selected",
            EventData::ScenarioChained(_) => "scenario_chained",
            EventData::ChildRunStarted(_) => "child_run_started",
            EventData::ChildRunSettled(_) => "child_run_settled",
            EventData::ChildRunUnsettled(_) => "child_run_unsettled",
            EventData::ScratchpadWritten(_) => "scratchpad_written",
            EventData::WavePlanned(_) => "wave_planned",
            EventData::WaveDispatched(_) => "wave_dispatched",
            EventData::WaveRecorded(_) => "wave_recorded",
            EventData::WaveDecided(_) => "wave_decided",
            EventData::RunReplayed(_) => "run_replayed",
            EventData::RunForked(_) => "run_forked",
            EventData::SteeringReceived(_) => "steering_received",
            EventData::SteeringDelivered(_) => "steering_delivered",
            EventData::LateResultDiscarded(_) => "late_result_discarded",
            EventData::ToolCallStarted(_) => "tool_call_started",
            EventData::ToolCallFinished(_) => "tool_call_finished",
            EventData::ToolCallReissued(_) => "tool_call_reissued",
            EventData::ToolsListed(_) => "tools_listed",
        }
    }

    /// What the event says a call spent (cost, tokens): a model's answer's or cut call's, or
    /// a priced tool call's receipt; `None` for every other kind.
    pub fn spend(&self) -> Option<(f64, u64)> {
        match self {
            EventData::ModelResponse(r) => Some((r.cost_usd, r.usage.total())),
            EventData::ModelCallCut(c) => Some((c.cost_usd, c.usage.total())),
            EventData::ToolCallFinished(f) if f.cost_usd > 0.0 => Some((f.cost_usd, 0)),
            EventData::RunTakenOver(t) if t.charged_usd > 0.0 => Some((t.charged_usd, 0)),
            _ => None,
        }
    }

    /// The payload's encoding: its fields as JSON text, in the order the payload's struct
    /// declares them, with no whitespace — what the store keeps and the hash chain hashes
    /// ([`crate::chain::Form::Encoded`]). Made once per event, straight from the struct.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.encode_into(&mut out);
        out
    }

    /// [`EventData::encode`], appended to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        // Writing a payload into a Vec cannot fail: every payload is plain data (strings,
        // numbers, JSON values with string keys).
        let _ = match self {
            EventData::ScenarioStarted(p) => serde_json::to_writer(&mut *out, p),
            EventData::LevelStarted(p) => serde_json::to_writer(&mut *out, p),
            EventData::PromptSent(p) => serde_json::to_writer(&mut *out, p),
            EventData::RoutingDecision(p) => serde_json::to_writer(&mut *out, p),
            EventData::ModelResponse(p) => serde_json::to_writer(&mut *out, p),
            EventData::ModelStopped(p) => serde_json::to_writer(&mut *out, p),
            EventData::ModelCallFailed(p) => serde_json::to_writer(&mut *out, p),
            EventData::ModelCallCut(p) => serde_json::to_writer(&mut *out, p),
            EventData::ProviderFailover(p) => serde_json::to_writer(&mut *out, p),
            EventData::ProviderRetry(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolCall(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolResult(p) => serde_json::to_writer(&mut *out, p),
            EventData::FileCreated(p) => serde_json::to_writer(&mut *out, p),
            EventData::VerifierStarted(p) => serde_json::to_writer(&mut *out, p),
            EventData::VerifierFinished(p) => serde_json::to_writer(&mut *out, p),
            EventData::AskUser(p) => serde_json::to_writer(&mut *out, p),
            EventData::UserAnswered(p) => serde_json::to_writer(&mut *out, p),
            EventData::ApprovalRequested(p) => serde_json::to_writer(&mut *out, p),
            EventData::ApprovalDecided(p) => serde_json::to_writer(&mut *out, p),
            EventData::LevelFinished(p) => serde_json::to_writer(&mut *out, p),
            EventData::LevelTimedOut(p) => serde_json::to_writer(&mut *out, p),
            EventData::GateDecision(p) => serde_json::to_writer(&mut *out, p),
            EventData::BudgetConsumed(p) => serde_json::to_writer(&mut *out, p),
            EventData::BudgetExceeded(p) => serde_json::to_writer(&mut *out, p),
            EventData::RetryScheduled(p) => serde_json::to_writer(&mut *out, p),
            EventData::RetryAttempted(p) => serde_json::to_writer(&mut *out, p),
            EventData::Heartbeat(p) => serde_json::to_writer(&mut *out, p),
            EventData::CancelRequested(p) => serde_json::to_writer(&mut *out, p),
            EventData::Warning(p) => serde_json::to_writer(&mut *out, p),
            EventData::ScenarioFinished(p) => serde_json::to_writer(&mut *out, p),
            EventData::ScenarioUpgraded(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunInterrupted(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunResumed(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunPaused(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunTakenOver(p) => serde_json::to_writer(&mut *out, p),
            EventData::AgentHandoff(p) => serde_json::to_writer(&mut *out, p),
            EventData::ScenarioSelected(p) => serde_json::to_writer(&mut *out, p),
            EventData::ScenarioChained(p) => serde_json::to_writer(&mut *out, p),
            EventData::ChildRunStarted(p) => serde_json::to_writer(&mut *out, p),
            EventData::ChildRunSettled(p) => serde_json::to_writer(&mut *out, p),
            EventData::ChildRunUnsettled(p) => serde_json::to_writer(&mut *out, p),
            EventData::ScratchpadWritten(p) => serde_json::to_writer(&mut *out, p),
            EventData::WavePlanned(p) => serde_json::to_writer(&mut *out, p),
            EventData::WaveDispatched(p) => serde_json::to_writer(&mut *out, p),
            EventData::WaveRecorded(p) => serde_json::to_writer(&mut *out, p),
            EventData::WaveDecided(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunReplayed(p) => serde_json::to_writer(&mut *out, p),
            EventData::RunForked(p) => serde_json::to_writer(&mut *out, p),
            EventData::SteeringReceived(p) => serde_json::to_writer(&mut *out, p),
            EventData::SteeringDelivered(p) => serde_json::to_writer(&mut *out, p),
            EventData::LateResultDiscarded(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolCallStarted(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolCallFinished(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolCallReissued(p) => serde_json::to_writer(&mut *out, p),
            EventData::ToolsListed(p) => serde_json::to_writer(&mut *out, p),
        };
    }

    /// The payload alone, as JSON.
    pub fn payload(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut map)) => map.remove("data").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// Decodes a stored payload, given as JSON text, of `kind` written with schema `version`.
    pub fn decode_str(kind: &str, version: u16, payload: &str) -> Result<EventData, DecodeError> {
        let mut de = serde_json::Deserializer::from_str(payload);
        let data = Self::decode_from(kind, version, &mut de)?;
        de.end().map_err(|e| DecodeError { kind: kind.to_owned(), message: e.to_string() })?;
        Ok(data)
    }

    /// Decodes a stored payload, given as JSON text in bytes (an encoding, say), of `kind`
    /// written with schema `version`.
    pub fn decode_bytes(
        kind: &str,
        version: u16,
        payload: &[u8],
    ) -> Result<EventData, DecodeError> {
        let mut de = serde_json::Deserializer::from_slice(payload);
        let data = Self::decode_from(kind, version, &mut de)?;
        de.end().map_err(|e| DecodeError { kind: kind.to_owned(), message: e.to_string() })?;
        Ok(data)
    }

    /// Decodes a stored payload, given as a JSON value, of `kind` written with schema
    /// `version`.
    pub fn decode_value(
        kind: &str,
        version: u16,
        payload: Value,
    ) -> Result<EventData, DecodeError> {
        Self::decode_from(kind, version, payload)
    }

    fn decode_from<'de, D: serde::Deserializer<'de>>(
        kind: &str,
        version: u16,
        payload: D,
    ) -> Result<EventData, DecodeError> {
        let fail = |e: D::Error| DecodeError { kind: kind.to_owned(), message: e.to_string() };
        match (version, kind) {
            (VERSION, _) => {}
            (1, "scenario_started") => {
                return v1::ScenarioStarted::deserialize(payload)
                    .map(|old| EventData::ScenarioStarted(Box::new(old.into())))
                    .map_err(fail);
            }
            (1, "approval_decided") => {
                return v1::ApprovalDecided::deserialize(payload)
                    .map(|old| EventData::ApprovalDecided(old.into()))
                    .map_err(fail);
            }
            // Every other kind reads the same in version 1.
            (1, _) => {}
            _ => {
                return Err(DecodeError {
                    kind: kind.to_owned(),
                    message: format!(
                        "schema version {version} is not known (this build reads 1 to {VERSION})"
                    ),
                });
            }
        }
        macro_rules! decode {
            ($($name:literal => $variant:ident),* $(,)?) => {
                match kind {
                    $($name => Deserialize::deserialize(payload).map(EventData::$variant).map_err(fail),)*
                    other => Err(DecodeError { kind: other.to_owned(), message: "unknown event kind".to_owned() }),
                }
            };
        }
        decode! {
            "scenario_started" => ScenarioStarted,
            "level_started" => LevelStarted,
            "prompt_sent" => PromptSent,
            "routing_decision" => RoutingDecision,
            "model_response" => ModelResponse,
            "model_stopped" => ModelStopped,
            "model_call_failed" => ModelCallFailed,
            "model_call_cut" => ModelCallCut,
            "provider_failover" => ProviderFailover,
            "provider_retry" => ProviderRetry,
            "tool_call" => ToolCall,
            "tool_result" => ToolResult,
            "file_created" => FileCreated,
            "verifier_started" => VerifierStarted,
            "verifier_finished" => VerifierFinished,
            "ask_user" => AskUser,
            "user_answered" => UserAnswered,
            "approval_requested" => ApprovalRequested,
            "approval_decided" => ApprovalDecided,
            "level_finished" => LevelFinished,
            "level_timed_out" => LevelTimedOut,
            "gate_decision" => GateDecision,
            "budget_consumed" => BudgetConsumed,
            "budget_exceeded" => BudgetExceeded,
            "retry_scheduled" => RetryScheduled,
            "retry_attempted" => RetryAttempted,
            "heartbeat" => Heartbeat,
            "cancel_requested" => CancelRequested,
            "warning" => Warning,
            "scenario_finished" => ScenarioFinished,
            "scenario_upgraded" => ScenarioUpgraded,
            "run_interrupted" => RunInterrupted,
            "run_resumed" => RunResumed,
            "run_paused" => RunPaused,
            "run_taken_over" => RunTakenOver,
            "agent_handoff" => AgentHandoff,
            "scenario_selected" => ScenarioSelected,
            "scenario_chained" => ScenarioChained,
            "child_run_started" => ChildRunStarted,
            "child_run_settled" => ChildRunSettled,
            "child_run_unsettled" => ChildRunUnsettled,
            "scratchpad_written" => ScratchpadWritten,
            "wave_planned" => WavePlanned,
            "wave_dispatched" => WaveDispatched,
            "wave_recorded" => WaveRecorded,
            "wave_decided" => WaveDecided,
            "run_replayed" => RunReplayed,
            "run_forked" => RunForked,
            "steering_received" => SteeringReceived,
            "steering_delivered" => SteeringDelivered,
            "late_result_discarded" => LateResultDiscarded,
            "tool_call_started" => ToolCallStarted,
            "tool_call_finished" => ToolCallFinished,
            "tool_call_reissued" => ToolCallReissued,
            "tools_listed" => ToolsListed,
        }
    }
}

/// A stored event that this build cannot read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("cannot decode a `{kind}` event: {message}")]
pub struct DecodeError {
    pub kind: String,
    pub message: String,
}

#[cfg(test)]
mod size {
    /// Every staged, stored and loaded event is moved and copied many times per level: the
    /// large, rare payloads are boxed so an event stays small.
    #[test]
    fn an_event_stays_small() {
        let size = std::mem::size_of::<super::Event>();
        assert!(size <= 256, "an event takes {size} bytes: box the payload that grew");
    }
}
