//! The level runners: the work of one attempt of each level kind, as a batch of events —
//! prompts (their verdicts read, one repair call), tool loops, verifier levels (serial,
//! parallel or race, judges asked through the engine's `Judge`), fan-outs (children at
//! once, each settled child sent to be committed, the fan-in), approvals. The engine's
//! executor hands each step to [`Runners`], its `LevelRunner`; nothing here drives a run,
//! plans a step or touches the log.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton_engine::cancel::CancelToken;
use baton_engine::clock::elapsed_ms;
use baton_engine::event::{
    ApprovalRequested, AskUser, BudgetExceeded, EventData, LevelFinished, LevelStarted,
    LevelTimedOut, ModelCallFailed, ModelResponse, ModelStopped, NewEvent, PromptSent,
    VerifierFinished, VerifierStarted,
};
use baton_engine::fan_in::{self, ChildResult, ChildState};
use baton_engine::future::BoxFuture;
use baton_engine::join::join_limited;
use baton_engine::limits;
use baton_engine::model::{ModelError, ModelReply, ModelRequest, STOP_MAX_TOKENS};
use baton_engine::render;
use baton_engine::reservation::Reservation;
use baton_engine::runner::{LevelRun, LevelRunner, kept_when_cut};
use baton_engine::verifier::{self, VerifyContext};
use baton_scenario::model::{
    ErrorKind, LevelIdx, LevelKind, Mode, OnFail, Response, Uses, VerifierSpec,
};
use baton_scenario::schema::JsonSchema;
use serde_json::{Map, Value, json};

mod approval;
mod attempt;
mod calls;
mod fan_out;
mod own_tools;
mod prompt;
mod resume;
pub mod tool_loop;
pub mod verdict;
mod verifiers;

/// Every level kind's runner: the `LevelRunner` an engine is given.
#[derive(Clone, Copy, Debug, Default)]
pub struct Runners;

impl LevelRunner for Runners {
    fn run(&self, run: LevelRun) -> BoxFuture<'static, Vec<NewEvent>> {
        Box::pin(async move { Attempt(run).bounded(false).await })
    }
}

/// One attempt of one level, as the runners work it: the engine's [`LevelRun`].
#[derive(Clone, Debug)]
pub(crate) struct Attempt(pub(crate) LevelRun);

impl Deref for Attempt {
    type Target = LevelRun;

    fn deref(&self) -> &LevelRun {
        &self.0
    }
}

impl DerefMut for Attempt {
    fn deref_mut(&mut self) -> &mut LevelRun {
        &mut self.0
    }
}

impl Attempt {
    /// Commits `event` before the step acts on the world, after what the step did so far
    /// (in order); false when the step is being cut (the executor dropped its answer), and
    /// then nothing may be done. Without a channel (a fan-out's child, whose events are
    /// committed as it settles) the event is staged with the others.
    pub(crate) async fn commit_before(&self, events: &mut Vec<NewEvent>, event: NewEvent) -> bool {
        let Some(channel) = &self.sent else {
            events.push(event);
            return true;
        };
        let mut batch = std::mem::take(events);
        batch.push(event);
        let (ack, acked) = tokio::sync::oneshot::channel();
        channel.send((batch, ack)).await.is_ok() && acked.await.is_ok()
    }
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

/// A duration as people read it: `1.5 s`.
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Why a prompt level stopped before its result.
pub(crate) enum Stop {
    /// A budget refusal or a cancel: the planner decides what follows.
    Halted,
    /// The attempt failed, with how when edges may route it (`None`: the run fails).
    Failed(String, Option<ErrorKind>),
    /// Every model the level may use was unavailable after its retries (a transient
    /// fault): the run stops without ending, the attempt to be run again on resume.
    Interrupted(String),
}

impl Stop {
    pub(crate) fn finish(
        self,
        run: &Attempt,
        events: &mut Vec<NewEvent>,
        started: Instant,
    ) -> Vec<NewEvent> {
        match self {
            // The planner sees the abort and closes the level as skipped.
            Stop::Halted => {}
            Stop::Interrupted(reason) => {
                events.push(run.event(EventData::RunInterrupted(
                    baton_engine::runner::interrupted(
                        baton_engine::event::CAUSE_UNAVAILABLE,
                        reason,
                    ),
                )));
            }
            Stop::Failed(message, kind) => {
                events.push(run.event(EventData::LevelFinished(Box::new(LevelFinished {
                    error_kind: kind,
                    ..LevelFinished::failed(message, elapsed_ms(started))
                }))));
            }
        }
        std::mem::take(events)
    }
}
