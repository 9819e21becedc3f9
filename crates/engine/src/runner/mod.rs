//! Runners: the work of one attempt of a level, per kind, as a batch of events.
//!
//! A runner reads the state as of the start of its step, talks to the world only through
//! the [`Runtime`]'s traits, and returns every event of the step; the executor appends
//! them in one transaction. A crash mid-step loses the step, which the planner then gives
//! again: at most the in-flight step is executed twice, and the log never holds half of
//! one. A fan-out is the exception by design: each child that finishes is sent to the
//! executor on [`Settled`] and committed as its own batch, so a crash or a cancel loses only
//! the children still running, and the step given again runs only those.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton_scenario::Scenario;
use baton_scenario::model::{LevelIdx, LevelKind, Mode, OnFail, Response, Uses, VerifierSpec};
use baton_scenario::schema::JsonSchema;
use serde_json::{Map, Value, json};

use crate::cancel::CancelToken;
use crate::clock::elapsed_ms;
use crate::event::{
    ApprovalRequested, AskUser, BudgetExceeded, EventData, LevelFinished, LevelStarted,
    LevelTimedOut, ModelCallFailed, ModelResponse, ModelStopped, NewEvent, PromptSent,
    VerifierFinished, VerifierStarted,
};
use crate::fan_in::{self, ChildResult, ChildState};
use crate::join::join_limited;
use crate::limits;
use crate::model::{ModelError, ModelProvider, ModelReply, ModelRequest, STOP_MAX_TOKENS};
use crate::render::{self, Renderer};
use crate::reservation::{Reservation, Reservations};
use crate::state::RunState;
use crate::verdict;
use crate::verifier::{self, Verifiers, VerifyContext};

/// What runners use to reach the world.
#[derive(Debug)]
pub struct Runtime {
    pub model: Arc<dyn ModelProvider>,
    pub verifiers: Verifiers,
    /// The directory verifiers run in when the engine has no `workspaces` (an embedder's
    /// choice), and for runs recorded without a workspace. With `workspaces`, every run
    /// whose verifiers read files has a workspace of its own (`exec::needs_workspace`).
    pub workspace: PathBuf,
    /// Opens workspaces for scenarios with tool-loop levels; without it, such scenarios
    /// cannot run.
    pub workspaces: Option<crate::workspace::WorkspaceSetup>,
    /// The scenarios the intent classifier may choose from (`catalog` in templates).
    pub catalog: Arc<Value>,
    /// Takes the secrets the process knows, and key-shaped tokens, out of provider errors,
    /// verifier outcomes and MCP results before they are recorded.
    pub redactor: crate::redact::Redactor,
    /// What every program a run starts (verifiers, scanners, MCP servers) runs in.
    pub jail: Arc<baton_jail::Jail>,
    /// The scenarios jobs select and chain to; without it, a run starts no child runs (a
    /// result naming an intent route ends the run with a warning).
    pub jobs: Option<Arc<crate::job::Jobs>>,
}

/// One attempt of one level, with everything it reads.
#[derive(Clone, Debug)]
pub struct LevelRun {
    pub scenario: Arc<Scenario>,
    pub renderer: Arc<Renderer>,
    pub state: Arc<RunState>,
    pub runtime: Arc<Runtime>,
    pub run_id: Arc<str>,
    pub level: LevelIdx,
    pub attempt: u32,
    pub cancel: CancelToken,
    /// The run's workspace, when its scenario has one.
    pub workspace: Option<Arc<dyn crate::workspace::Workspace>>,
    /// When the attempt must be done, the earliest of its level's `timeout_s` and the run's
    /// `max_duration_s`: model clients wait no longer, nor retry later.
    pub deadline: Option<Instant>,
    /// The engine's clock: an approval request's deadline is set by it.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// What the step's model calls have spent and hold against the cost cap, shared by a
    /// fan-out's children (see [`Reservations`]).
    pub reservations: Reservations,
    /// Where a fan-out sends each child's events once the child has finished, for the
    /// executor to commit then; without it, every child's events come back with the step.
    pub settled: Option<Settled>,
}

/// The channel a fan-out sends its finished children's events through, one batch per
/// child (so one with room for every child never refuses a batch).
pub type Settled = tokio::sync::mpsc::Sender<Vec<NewEvent>>;

/// The result of a level that could not run to a result.
pub(crate) fn error_finish(message: String, duration_ms: u64) -> LevelFinished {
    LevelFinished {
        ok: false,
        skipped: false,
        verdict: None,
        output: String::new(),
        parsed: None,
        confidence: None,
        scratchpad: Map::new(),
        conflict: None,
        error: Some(message),
        cost_usd: 0.0,
        tokens: 0,
        duration_ms,
        terminal: false,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}

impl LevelRun {
    pub(crate) fn id(&self) -> &str {
        &self.scenario.levels[self.level].id
    }

    /// Runs this level's verifiers on `output` (and its parsed JSON).
    async fn verify(
        &self,
        calls: &mut Calls<'_>,
        output: String,
        parsed: Option<Value>,
        events: &mut Vec<NewEvent>,
    ) -> Vec<VerifierFinished> {
        let level = &self.scenario.levels[self.level];
        let ctx = VerifyContext {
            workspace: self.workspace_dir(),
            jail: Arc::clone(&self.runtime.jail),
            input: self.state.input.clone(),
            output,
            parsed,
            scratchpad: self.state.scratchpad.clone(),
        };
        run_verifiers(self, calls, &level.verifiers, level.mode, level.run_all, &ctx, events).await
    }

    /// Where verifiers run: the run's workspace, else the runtime's directory.
    pub(crate) fn workspace_dir(&self) -> PathBuf {
        self.workspace
            .as_ref()
            .map_or_else(|| self.runtime.workspace.clone(), |w| w.root().to_path_buf())
    }

    /// The model calls of this attempt, numbered on from the ones already in the log.
    pub(crate) fn calls(&self) -> Calls<'_> {
        let level = self.state.level(self.id());
        Calls {
            run: self,
            call_index: level.map_or(0, |l| l.calls_total),
            cost_usd: 0.0,
            tokens: 0,
            call: level.map_or(0, |l| l.calls),
        }
    }

    pub(crate) fn event(&self, data: EventData) -> NewEvent {
        NewEvent::level(self.id(), self.attempt, data)
    }

    /// Runs the attempt and returns its events.
    pub async fn run(&self) -> Vec<NewEvent> {
        self.bounded(false).await
    }

    /// Runs the attempt within the level's `timeout_s`. At the deadline the attempt's own
    /// cancel token fires (its model stream is dropped, its processes are killed) and the
    /// attempt is awaited until it has stopped, so nothing it started runs or writes after
    /// it; what it did is replaced by `level_timed_out` and a failed `level_finished`. The
    /// model calls it made are kept: their spend counts.
    async fn bounded(&self, in_fan_out: bool) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        // An approval's timeout bounds the wait for a person, not work.
        let limit = match level.kind {
            LevelKind::HumanApproval { .. } => None,
            _ => level.timeout_s.map(Duration::from_secs_f64),
        };
        let Some(limit) = limit else { return self.body(in_fan_out).await };
        let started = Instant::now();
        let mut attempt = self.clone();
        attempt.cancel = self.cancel.child();
        let ends = started + limit;
        attempt.deadline = Some(self.deadline.map_or(ends, |d| d.min(ends)));
        let work = attempt.body(in_fan_out);
        tokio::pin!(work);
        tokio::select! {
            events = &mut work => return events,
            () = tokio::time::sleep(limit) => {}
        }
        attempt.cancel.cancel();
        let cut = work.await;
        if self.cancel.is_cancelled() {
            // The run was cancelled meanwhile: the executor keeps none of the step.
            return cut;
        }
        let mut events = kept_when_cut(cut);
        let elapsed = elapsed_ms(started);
        let timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        events.push(
            self.event(EventData::LevelTimedOut(LevelTimedOut { timeout_ms, elapsed_ms: elapsed })),
        );
        let (cost_usd, tokens) = events
            .iter()
            .filter(|e| e.level_id.as_deref() == Some(self.id()))
            .filter_map(|e| e.data.spend())
            .fold((0.0, 0), |(c, t), (cost, tokens)| (c + cost, t + tokens));
        let mut finished = error_finish(String::new(), elapsed);
        finished.error = None;
        finished.cost_usd = cost_usd;
        finished.tokens = tokens;
        finished.conflict = Some(format!("timed_out:{}", level.id));
        finished.scratchpad.insert(
            "feedback".to_owned(),
            Value::String(format!(
                "level `{}` attempt {} timed out after {} (timeout_s) and was cut",
                level.id,
                self.attempt,
                seconds(limit)
            )),
        );
        events.push(self.event(EventData::LevelFinished(finished)));
        events
    }

    /// The attempt's work, by kind; inside a fan-out only the kinds a child may be.
    async fn body(&self, in_fan_out: bool) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        match &level.kind {
            LevelKind::Prompt { .. } => self.prompt().await,
            LevelKind::Verifier => self.verifier_level().await,
            // Each approval child asks for its own decision and waits for it.
            LevelKind::HumanApproval { .. } => self.approval(),
            _ if in_fan_out => vec![self.event(EventData::LevelFinished(error_finish(
                format!(
                    "fan-out child `{}` is a {}, which cannot run inside a fan-out",
                    level.id,
                    level.kind_name()
                ),
                0,
            )))],
            LevelKind::FanOut { .. } => Box::pin(self.fan_out()).await,
            LevelKind::ToolLoop { .. } => self.tool_loop().await,
            // The planner and the executor drive a wave; it never comes to a runner.
            LevelKind::Wave(_) => vec![self.event(EventData::LevelFinished(error_finish(
                format!("wave level `{}` is driven by the executor, not run as a step", level.id),
                0,
            )))],
        }
    }
}

/// What an attempt cut at a deadline keeps of its events: the model calls it made, whose
/// spend counts; nothing that would end, route or pause its level.
pub(crate) fn kept_when_cut(events: Vec<NewEvent>) -> Vec<NewEvent> {
    events
        .into_iter()
        .filter(|e| {
            e.data.spend().is_some()
                || matches!(e.data, EventData::PromptSent(_) | EventData::RoutingDecision(_))
        })
        .collect()
}

/// The key of a judge's `details` that says its model was unavailable.
const INTERRUPTED_KEY: &str = "interrupted";

/// Why a judge of these outcomes could not be asked (every model unavailable), if one
/// could not: its level stops without a result, to run again on resume.
fn interrupted_judge(outcomes: &[VerifierFinished]) -> Option<String> {
    outcomes
        .iter()
        .find_map(|o| o.details.get(INTERRUPTED_KEY).and_then(Value::as_str).map(str::to_owned))
}

/// The fact that a run stopped without ending, and why.
pub(crate) fn interrupted(cause: &str, reason: String) -> crate::event::RunInterrupted {
    crate::event::RunInterrupted { cause: cause.to_owned(), reason }
}

/// A duration as people read it: `1.5 s`.
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Why a prompt level stopped before its result.
pub(crate) enum Stop {
    /// A budget refusal or a cancel: the planner decides what follows.
    Halted,
    Failed(String),
    /// Every model the level may use was unavailable after its retries (a transient
    /// fault): the run stops without ending, the attempt to be run again on resume.
    Interrupted(String),
}

impl Stop {
    pub(crate) fn finish(
        self,
        run: &LevelRun,
        events: &mut Vec<NewEvent>,
        started: Instant,
    ) -> Vec<NewEvent> {
        match self {
            // The planner sees the abort and closes the level as skipped.
            Stop::Halted => {}
            Stop::Interrupted(reason) => {
                events.push(run.event(EventData::RunInterrupted(interrupted(
                    crate::event::CAUSE_UNAVAILABLE,
                    reason,
                ))));
            }
            Stop::Failed(message) => {
                events.push(
                    run.event(EventData::LevelFinished(error_finish(message, elapsed_ms(started)))),
                );
            }
        }
        std::mem::take(events)
    }
}

mod approval;
mod calls;
mod fan_out;
mod prompt;
mod verifiers;

pub(crate) use calls::Calls;
use verifiers::{failures, feedback_text, run_verifiers};
