//! The runners' interface: the [`Runtime`] a level's attempt reaches the world through, the
//! [`LevelRun`] it reads, and the [`LevelRunner`] the executor hands each step to. The
//! work of each level kind — prompts and their verdicts, tool loops, verifier levels and
//! judges, fan-outs, approvals — is the embedder's (`baton-runners`): the kernel holds no
//! runner of its own.
//!
//! A runner reads the state as of the start of its step, talks to the world only through
//! the [`Runtime`]'s traits, and returns every event of the step; the executor appends
//! them in one transaction. A crash mid-step loses the step, which the planner then gives
//! again: at most the in-flight step is executed twice, and the log never holds half of
//! one. A fan-out is the exception by design: each child that finishes is sent to the
//! executor on [`Settled`] and committed as its own batch, so a crash or a cancel loses only
//! the children still running, and the step given again runs only those. A tool loop is
//! the other: what it commits before a call ([`Sent`]) stays, and the attempt given again
//! goes through its committed events ([`LevelRun::resumed`]) before it acts again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use baton_scenario::Scenario;
use baton_scenario::model::{LevelIdx, LevelKind};
use serde_json::Value;

use crate::cancel::CancelToken;
use crate::event::{EventData, NewEvent};
use crate::future::BoxFuture;
use crate::model::ModelProvider;
use crate::render::Renderer;
use crate::reservation::Reservations;
use crate::state::RunState;
use crate::verifier::Verifiers;

/// The work of one attempt of a level, by its kind: every event of the step.
pub trait LevelRunner: Send + Sync + std::fmt::Debug {
    /// Runs the attempt and returns its events (see the module's documentation).
    fn run(&self, run: LevelRun) -> BoxFuture<'static, Vec<NewEvent>>;
}

/// What runners use to reach the world.
#[derive(Debug)]
pub struct Runtime {
    pub model: Arc<dyn ModelProvider>,
    pub verifiers: Verifiers,
    /// The directory verifiers run in when the engine has no `workspaces` (an embedder's
    /// choice), and for runs recorded without a workspace. With `workspaces`, every run
    /// whose verifiers read files has a workspace of its own (`jobs::needs_workspace`).
    pub workspace: PathBuf,
    /// Opens workspaces for scenarios with tool-loop levels; without it, such scenarios
    /// cannot run.
    pub workspaces: Option<crate::workspace::WorkspaceSetup>,
    /// The scenarios the intent classifier may choose from (`catalog` in templates).
    pub catalog: Arc<Value>,
    /// The embedder's: takes the secrets the process knows, and key-shaped tokens, out of
    /// provider errors, verifier outcomes and MCP results before they are recorded.
    pub redactor: Arc<dyn crate::redact::Redact>,
    /// The scenarios jobs select and chain to; without it, a run starts no child runs (a
    /// result naming an intent route ends the run with a warning).
    pub jobs: Option<Arc<crate::job::Jobs>>,
    /// The work of each level kind (`baton-runners`).
    pub runner: Arc<dyn LevelRunner>,
    /// Makes the calls of the user's own tools; without it, a tool loop that declares
    /// tools of the user's answers each of their calls with an error saying so.
    pub tools: Option<Arc<dyn crate::tools::ToolHost>>,
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
    /// Where a call that reaches out commits its `prompt_sent` before it is made; without
    /// it (a fan-out's children, whose events are committed as each settles), the record
    /// comes back with the step.
    pub sent: Option<Sent>,
    /// The steering messages the step's calls of steerable levels take, once.
    pub steering: crate::steering::Mailbox,
    /// A tool loop's attempt that an earlier driver began: the events of this attempt it
    /// committed (after `level_started`, heartbeats left out), in order. The runner goes
    /// through them again instead of acting — each model answer and tool receipt read from
    /// here, none of these events written twice — and acts from where they end.
    pub resumed: Arc<[crate::event::Event]>,
}

/// The channel a fan-out sends its finished children's events through, one batch per
/// child (so one with room for every child never refuses a batch).
pub type Settled = tokio::sync::mpsc::Sender<Vec<NewEvent>>;

/// The channel an attempt sends a call's `prompt_sent` (after the step's events so far)
/// through to have it committed before the call is made; the executor answers once it is,
/// and drops the answer when the step is being cut (the call is then not made).
pub type Sent = tokio::sync::mpsc::Sender<(Vec<NewEvent>, tokio::sync::oneshot::Sender<()>)>;

impl LevelRun {
    /// The level's id.
    pub fn id(&self) -> &str {
        &self.scenario.levels[self.level].id
    }

    /// An event of this attempt of the level.
    pub fn event(&self, data: EventData) -> NewEvent {
        NewEvent::level(self.id(), self.attempt, data)
    }

    /// Where verifiers run: the run's workspace, else the runtime's directory.
    pub fn workspace_dir(&self) -> PathBuf {
        self.workspace
            .as_ref()
            .map_or_else(|| self.runtime.workspace.clone(), |w| w.root().to_path_buf())
    }
}

/// What an attempt cut at a deadline keeps of its events: the model calls it made, whose
/// spend counts; nothing that would end, route or pause its level.
pub fn kept_when_cut(events: Vec<NewEvent>) -> Vec<NewEvent> {
    events
        .into_iter()
        .filter(|e| {
            e.data.spend().is_some()
                || matches!(e.data, EventData::PromptSent(_) | EventData::RoutingDecision(_))
        })
        .collect()
}

/// The fact that a run stopped without ending, and why.
pub fn interrupted(cause: &str, reason: String) -> crate::event::RunInterrupted {
    crate::event::RunInterrupted { cause: cause.to_owned(), reason }
}

/// The channel a fan-out step sends its finished children through, with room for one
/// batch per child; none for other levels.
pub(crate) fn settled_channel(
    scenario: &Scenario,
    level: baton_scenario::model::LevelIdx,
) -> (Option<Settled>, Option<tokio::sync::mpsc::Receiver<Vec<NewEvent>>>) {
    match &scenario.levels[level].kind {
        LevelKind::FanOut { children, .. } => {
            let (sender, receiver) = tokio::sync::mpsc::channel(children.len().max(1));
            (Some(sender), Some(receiver))
        }
        _ => (None, None),
    }
}

/// The next batch a fan-out's child sent; never resolves without a channel or once it is
/// closed.
pub(crate) async fn next_settled(
    settled: Option<&mut tokio::sync::mpsc::Receiver<Vec<NewEvent>>>,
) -> Vec<NewEvent> {
    if let Some(settled) = settled
        && let Some(batch) = settled.recv().await
    {
        return batch;
    }
    std::future::pending().await
}
