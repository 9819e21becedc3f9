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
    LevelTimedOut, ModelResponse, ModelStopped, NewEvent, PromptSent, VerifierFinished,
    VerifierStarted,
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
        }
    }

    async fn prompt(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let LevelKind::Prompt { prompt, response } = &level.kind else { return Vec::new() };
        let mut events = Vec::new();
        let ctx = render::context(&self.state, &self.run_id, &level.id, &self.runtime.catalog);
        let mut text = match self.renderer.render(prompt, &ctx) {
            Ok(t) => t,
            Err(e) => {
                events.push(
                    self.event(EventData::LevelFinished(error_finish(e, elapsed_ms(started)))),
                );
                return events;
            }
        };
        if !self.state.answers.is_empty() {
            let answers: Vec<&Value> = self.state.answers.iter().map(|(_, a)| a).collect();
            text.push_str(&format!(
                "\n\nThe user answered your questions: {}",
                Value::from(answers.into_iter().cloned().collect::<Vec<_>>())
            ));
        }
        let mut calls = self.calls();
        let json_mode = matches!(response, Response::Json { .. });
        let mut reply = match calls.call(&mut events, &prompt.name, &text, json_mode).await {
            Ok(r) => r,
            Err(stop) => return stop.finish(self, &mut events, started),
        };
        if let Some(question) = Some(&reply)
            .filter(|r| r.contains("ask_user"))
            .and_then(|r| verdict::parse_json(r))
            .and_then(|v| v.get("ask_user").cloned())
        {
            let call_id = format!("{}#{}#{}", level.id, self.attempt, calls.call);
            events.push(self.event(EventData::AskUser(AskUser { call_id, question })));
            return events;
        }
        let retries_max: u32 = level
            .verifiers
            .iter()
            .filter(|v| v.on_fail == OnFail::Retry)
            .map(|v| v.max_retries)
            .max()
            .unwrap_or(0);
        let mut retries_left = retries_max;
        let mut json_failure: Option<Vec<String>> = None;
        loop {
            let (mut verdict, confidence, parsed) = match response {
                Response::Markdown => (None, None, None),
                Response::Verdict => match verdict::parse(&reply) {
                    Some(v) => (Some(v.verdict), v.confidence, None),
                    None => {
                        let repair =
                            format!("{text}\n\nYour answer was:\n{reply}\n\n{}", verdict::CONTRACT);
                        match calls.call(&mut events, &prompt.name, &repair, false).await {
                            Ok(r) => reply = r,
                            Err(stop) => return stop.finish(self, &mut events, started),
                        }
                        match verdict::parse(&reply) {
                            Some(v) => (Some(v.verdict), v.confidence, None),
                            None => (Some("FAIL".to_owned()), None, None),
                        }
                    }
                },
                Response::Json { schema } => {
                    let mut parsed = verdict::parse_json(&reply);
                    let mut problems = json_problems(parsed.as_ref(), schema.as_ref());
                    if !problems.is_empty() {
                        // One repair call that says what was wrong.
                        let contract = schema.as_ref().map_or(String::new(), |s| {
                            format!(" matching this JSON Schema:\n{}", s.value())
                        });
                        let repair = format!(
                            "{text}\n\nYour answer was:\n{reply}\n\nAnswer with one JSON value{contract}\nProblems with your answer:\n- {}",
                            problems.join("\n- ")
                        );
                        match calls.call(&mut events, &prompt.name, &repair, true).await {
                            Ok(r) => reply = r,
                            Err(stop) => return stop.finish(self, &mut events, started),
                        }
                        parsed = verdict::parse_json(&reply);
                        problems = json_problems(parsed.as_ref(), schema.as_ref());
                    }
                    json_failure = (!problems.is_empty()).then_some(problems);
                    let confidence =
                        parsed.as_ref().and_then(|p| p.get("confidence")).and_then(Value::as_f64);
                    (None, confidence, parsed)
                }
            };
            let outcomes =
                self.verify(&mut calls, reply.clone(), parsed.clone(), &mut events).await;
            if let Some(reason) = interrupted_judge(&outcomes) {
                return Stop::Interrupted(reason).finish(self, &mut events, started);
            }
            let failed = failures(&level.verifiers, &outcomes);
            if failed.iter().any(|(spec, _)| spec.on_fail == OnFail::Retry) && retries_left > 0 {
                retries_left -= 1;
                let feedback = feedback_text(&failed);
                events.push(self.event(EventData::RetryScheduled(crate::event::RetryScheduled {
                    retry: retries_max - retries_left,
                    retries_max,
                    reason: feedback.trim_end().to_owned(),
                })));
                let retry = format!(
                    "{text}\n\nYour previous answer was:\n{reply}\n\nIt failed these checks; fix them:\n{feedback}"
                );
                match calls.call(&mut events, &prompt.name, &retry, json_mode).await {
                    Ok(r) => reply = r,
                    Err(stop) => return stop.finish(self, &mut events, started),
                }
                continue;
            }
            let mut scratchpad = Map::new();
            let mut feedback = String::new();
            if let Some(problems) = &json_failure {
                feedback.push_str(&format!(
                    "- the answer does not match its JSON contract: {}\n",
                    problems.join("; ")
                ));
            }
            feedback.push_str(&feedback_text(&failed));
            if !feedback.is_empty() {
                verdict = Some("FAIL".to_owned());
                scratchpad.insert("feedback".to_owned(), Value::String(feedback));
            }
            // A JSON answer's `scratchpad` object writes notes, each its own event.
            let (writes, refused) =
                crate::scratchpad::from_answer(&self.state.scratchpad, parsed.as_ref());
            for (key, value) in writes {
                events.push(self.event(EventData::ScratchpadWritten(
                    crate::event::ScratchpadWritten { key, value },
                )));
            }
            for message in refused {
                events.push(self.event(EventData::Warning(crate::event::Warning { message })));
            }
            let conflict = (verdict.as_deref() == Some("FAIL")).then(|| level.id.clone());
            events.push(self.event(EventData::LevelFinished(LevelFinished {
                ok: true,
                skipped: false,
                verdict,
                output: reply,
                parsed,
                confidence,
                scratchpad,
                conflict,
                error: None,
                cost_usd: calls.cost_usd,
                tokens: calls.tokens,
                duration_ms: elapsed_ms(started),
                terminal: level.terminal,
                touched_paths: Vec::new(),
                snapshot: None,
            })));
            return events;
        }
    }

    async fn verifier_level(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let mut events = Vec::new();
        let mut calls = self.calls();
        // A verifier level checks the work so far: the workspace, and for judges the output
        // of the last level that produced one.
        let last = self.state.last_output.clone().unwrap_or_default();
        let outcomes = self.verify(&mut calls, last, None, &mut events).await;
        if let Some(reason) = interrupted_judge(&outcomes) {
            return Stop::Interrupted(reason).finish(self, &mut events, started);
        }
        let failed = failures(&level.verifiers, &outcomes);
        let passed_names: Vec<&str> =
            outcomes.iter().filter(|o| o.passed).map(|o| o.name.as_str()).collect();
        let summary = if failed.is_empty() {
            format!("all {} verifiers passed ({})", outcomes.len(), passed_names.join(", "))
        } else {
            let names: Vec<&str> = failed.iter().map(|(s, _)| s.name.as_str()).collect();
            format!(
                "{} of {} verifiers failed ({})",
                failed.len(),
                outcomes.len(),
                names.join(", ")
            )
        };
        let mut scratchpad = Map::new();
        scratchpad.insert("build_result_summary".to_owned(), Value::String(summary.clone()));
        // The level's output is what later levels read of the check: the summary, and on
        // failure every failed verifier's reasons.
        let mut output = summary;
        let verdict = if failed.is_empty() {
            scratchpad.insert("build_feedback".to_owned(), Value::Null);
            "PASS"
        } else {
            let feedback = feedback_text(&failed);
            output = format!("{output}\n{feedback}");
            scratchpad.insert("build_feedback".to_owned(), Value::String(feedback));
            "FAIL"
        };
        events.push(self.event(EventData::LevelFinished(LevelFinished {
            ok: true,
            skipped: false,
            verdict: Some(verdict.to_owned()),
            output,
            parsed: None,
            confidence: None,
            scratchpad,
            conflict: (verdict == "FAIL").then(|| format!("verify:{}", level.id)),
            error: None,
            cost_usd: calls.cost_usd,
            tokens: calls.tokens,
            duration_ms: elapsed_ms(started),
            terminal: level.terminal,
            touched_paths: Vec::new(),
            snapshot: None,
        })));
        events
    }

    /// Runs the fan-out's children that have not started in its current attempt (all of
    /// them, but after a step stopped part-way); the others are read from the state.
    /// Each child that finishes is sent to the executor through `settled` to be committed
    /// at once, but the last to settle: its events come back with the fan-out's result, so
    /// the log never holds every child without the fan-out's end. The fan-out's result
    /// reads every child in declared order, whatever order they settled in.
    async fn fan_out(&self) -> Vec<NewEvent> {
        let started = Instant::now();
        let level = &self.scenario.levels[self.level];
        let LevelKind::FanOut { children, max_parallel, .. } = &level.kind else {
            return Vec::new();
        };
        let before = fan_in::children_in_attempt(&self.scenario, &self.state, self.level);
        let runs: Vec<LevelRun> = before
            .iter()
            .filter(|(_, c)| matches!(c, ChildState::NotStarted))
            .map(|&(child, _)| {
                let mut run = self.clone();
                run.level = child;
                run.attempt =
                    self.state.level(&self.scenario.levels[child].id).map_or(0, |l| l.attempts) + 1;
                run
            })
            .collect();
        let unsettled = AtomicUsize::new(runs.len());
        let futures = runs.iter().map(|run| {
            let parent = level.id.clone();
            let unsettled = &unsettled;
            async move {
                let child = &run.scenario.levels[run.level];
                let mut events = vec![run.event(EventData::LevelStarted(LevelStarted {
                    role: child.role.clone(),
                    kind: child.kind_name().to_owned(),
                    parent: Some(parent),
                }))];
                events.extend(run.bounded(true).await);
                let last = unsettled.fetch_sub(1, Ordering::SeqCst) == 1;
                let sent = !last && self.send_settled(&child.id, &events);
                (events, sent)
            }
        });
        let mut results = join_limited(futures.collect(), *max_parallel as usize).await.into_iter();
        // Every child in declared order: those that settled before this step from the
        // state, the others from what they did now.
        let mut ran: Vec<(LevelIdx, Vec<NewEvent>, bool)> = Vec::with_capacity(runs.len());
        for (child, state) in &before {
            if matches!(state, ChildState::NotStarted)
                && let Some((events, sent)) = results.next()
            {
                ran.push((*child, events, sent));
            }
        }
        let mut finished = Vec::with_capacity(children.len());
        let (mut budget_stop, mut waiting) = (false, false);
        let mut interrupted: Option<crate::event::RunInterrupted> = None;
        for (child, state) in &before {
            let child_id = self.scenario.levels[*child].id.as_str();
            match state {
                ChildState::Finished(result) => finished.push(result.clone()),
                ChildState::Unsettled => {
                    waiting |= self.state.open_approvals().any(|p| p.level_id == child_id);
                }
                ChildState::NotStarted => {
                    let Some((_, child_events, _)) = ran.iter().find(|(c, ..)| c == child) else {
                        continue;
                    };
                    for e in child_events {
                        match &e.data {
                            EventData::LevelFinished(f)
                                if e.level_id.as_deref() == Some(child_id) =>
                            {
                                finished.push(ChildResult {
                                    id: child_id,
                                    ok: f.ok,
                                    verdict: f.verdict.as_deref(),
                                    error: f.error.as_deref(),
                                    cost_usd: f.cost_usd,
                                    tokens: f.tokens,
                                });
                            }
                            EventData::BudgetExceeded(_) => budget_stop = true,
                            EventData::ApprovalRequested(_) => waiting = true,
                            EventData::RunInterrupted(i) => interrupted = Some(i.clone()),
                            _ => {}
                        }
                    }
                }
            }
        }
        // A child that waits for a decision leaves the fan-out in flight (unless another
        // child failed): the planner finishes it once the last decision is in.
        let waiting = waiting && finished.iter().all(|c| c.error.is_none());
        let result = (!budget_stop && !waiting && interrupted.is_none())
            .then(|| fan_in::aggregate(level, &finished, children.len(), elapsed_ms(started)));
        // What was not committed as its child settled comes back in declared order. A child
        // stopped by an outage keeps only what it spent, so a resume runs it again.
        let mut events: Vec<NewEvent> = Vec::new();
        for (_, child_events, sent) in ran {
            if sent {
                continue;
            }
            if child_events.iter().any(|e| matches!(e.data, EventData::RunInterrupted(_))) {
                events.extend(child_events.into_iter().filter(|e| {
                    e.data.spend().is_some() || matches!(e.data, EventData::ProviderRetry(_))
                }));
            } else {
                events.extend(child_events);
            }
        }
        if let Some(result) = result {
            events.push(self.event(EventData::LevelFinished(result)));
        }
        if let Some(interrupted) = interrupted {
            events.push(self.event(EventData::RunInterrupted(interrupted)));
        }
        events
    }

    /// Sends a child's events to the executor to be committed now, when the child finished
    /// (a child that waits for a person or was stopped comes back with the step) and the
    /// step goes on; whether they were sent.
    fn send_settled(&self, child_id: &str, events: &[NewEvent]) -> bool {
        let Some(settled) = &self.settled else { return false };
        let finished = events.iter().any(|e| {
            matches!(e.data, EventData::LevelFinished(_)) && e.level_id.as_deref() == Some(child_id)
        });
        finished && !self.cancel.is_cancelled() && settled.try_send(events.to_vec()).is_ok()
    }

    fn approval(&self) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        let LevelKind::HumanApproval { prompt, approver_role, output_schema } = &level.kind else {
            return Vec::new();
        };
        let question = match prompt {
            Some(p) => {
                let ctx =
                    render::context(&self.state, &self.run_id, &level.id, &self.runtime.catalog);
                match self.renderer.render(p, &ctx) {
                    Ok(q) => q,
                    Err(e) => {
                        return vec![self.event(EventData::LevelFinished(error_finish(e, 0)))];
                    }
                }
            }
            None => format!(
                "Approve the result of `{}`?",
                self.state.in_flight.clone().unwrap_or_default()
            ),
        };
        // The level's timeout bounds the wait for a decision.
        let deadline = level
            .timeout_s
            .and_then(|s| chrono::Duration::from_std(Duration::from_secs_f64(s)).ok())
            .map(|limit| self.clock.now() + limit);
        vec![self.event(EventData::ApprovalRequested(ApprovalRequested {
            request_id: format!("{}#{}", level.id, self.attempt),
            approver_role: approver_role.clone(),
            question,
            schema: output_schema.value().clone(),
            deadline,
        }))]
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

/// The model calls of one attempt, with their running cost.
pub(crate) struct Calls<'a> {
    pub(crate) run: &'a LevelRun,
    call_index: u32,
    pub(crate) call: u32,
    pub(crate) cost_usd: f64,
    pub(crate) tokens: u64,
}

impl Calls<'_> {
    async fn call(
        &mut self,
        events: &mut Vec<NewEvent>,
        template: &str,
        prompt: &str,
        json: bool,
    ) -> Result<String, Stop> {
        let level = &self.run.scenario.levels[self.run.level];
        // The level's own answer carries its schema; a judge's answer has its own shape.
        let schema = match &level.kind {
            LevelKind::Prompt { response: Response::Json { schema: Some(s) }, .. }
                if json && !template.starts_with("judge:") =>
            {
                Some(s.value().clone())
            }
            _ => None,
        };
        let request = ModelRequest {
            scenario_id: self.run.scenario.id.clone(),
            level_id: level.id.clone(),
            call_index: self.call_index,
            system: None,
            prompt: prompt.to_owned(),
            json,
            schema,
            max_tokens: limits::MAX_TOKENS_DEFAULT,
            constraint: level.model.clone(),
            turns: Vec::new(),
            tools: Vec::new(),
            deadline: None,
        };
        Ok(self.send(events, template, request, true).await?.text)
    }

    /// Counts a call that failed without an answer, so the next one gets the next index.
    pub(crate) fn skip(&mut self) {
        self.call_index += 1;
    }

    /// Reserves the call's worst case against the cost cap, with what the step's other calls
    /// (a fan-out's other children included) spent and hold; a call that would cross it is
    /// refused before it is made, recorded as `budget_exceeded`.
    fn reserve(
        &self,
        events: &mut Vec<NewEvent>,
        request: &ModelRequest,
    ) -> Result<Option<Reservation>, Stop> {
        let state = &self.run.state;
        let Some(max) = state.budget.max_cost_usd else { return Ok(None) };
        let worst = self.run.runtime.model.worst_case_cost_usd(request);
        match self.run.reservations.reserve(state.totals.cost_usd, worst, max) {
            Ok(reservation) => Ok(Some(reservation)),
            Err(reached) => {
                events.push(self.run.event(EventData::BudgetExceeded(BudgetExceeded {
                    limit_kind: "cost".to_owned(),
                    limit_value: max,
                    observed_value: reached,
                    refused_before_call: true,
                })));
                Err(Stop::Halted)
            }
        }
    }

    /// Makes one model call: refuses it when its worst case would cross the cost cap,
    /// records the prompt (when `record_prompt`), the routing and the answer, and counts
    /// its cost. The answer's text is cut at the size limit.
    pub(crate) async fn send(
        &mut self,
        events: &mut Vec<NewEvent>,
        template: &str,
        mut request: ModelRequest,
        record_prompt: bool,
    ) -> Result<ModelReply, Stop> {
        request.call_index = self.call_index;
        let reservation = self.reserve(events, &request)?;
        if record_prompt {
            events.push(self.run.event(EventData::PromptSent(PromptSent {
                template: template.to_owned(),
                system: request.system.clone(),
                prompt: request.prompt.clone(),
                call: self.call,
            })));
        }
        request.deadline = self.run.deadline;
        let result = self.run.runtime.model.call(&request, &self.run.cancel).await;
        // Every HTTP-level retry the client made is recorded, whatever the call's outcome,
        // and so is what a call cut short spent.
        let progress = self.run.cancel.progress();
        let redactor = &self.run.runtime.redactor;
        for mut retry in progress.take_retries(&request.level_id, request.call_index) {
            redactor.redact_in_place(&mut retry.reason);
            events.push(self.run.event(EventData::ProviderRetry(retry)));
        }
        let mut cut_usd = 0.0;
        for cut in progress.take_cuts(&request.level_id, request.call_index) {
            self.cost_usd += cut.cost_usd;
            self.tokens += cut.usage.total();
            cut_usd += cut.cost_usd;
            events.push(self.run.event(EventData::ModelCallCut(cut)));
        }
        // The reservation shrinks to what the call spent: its answer, or what a cut one cost.
        if let Some(reservation) = reservation {
            reservation.settle(result.as_ref().map_or(cut_usd, |reply| reply.cost_usd));
        }
        let mut reply = match result {
            Ok(r) => r,
            Err(ModelError::Cancelled) => return Err(Stop::Halted),
            Err(e @ ModelError::Unavailable { .. }) => {
                return Err(Stop::Interrupted(redactor.redact(&e.to_string()).into_owned()));
            }
            Err(e) => return Err(Stop::Failed(redactor.redact(&e.to_string()).into_owned())),
        };
        for mut failover in std::mem::take(&mut reply.failovers) {
            redactor.redact_in_place(&mut failover.reason);
            events.push(self.run.event(EventData::ProviderFailover(failover)));
        }
        if let Some(mut routing) = reply.routing.take() {
            routing.failovers.iter_mut().for_each(|f| redactor.redact_in_place(f));
            events.push(self.run.event(EventData::RoutingDecision(routing)));
        }
        if reply.text.len() > limits::MODEL_TEXT_BYTES_MAX {
            let mut cut = limits::MODEL_TEXT_BYTES_MAX;
            while !reply.text.is_char_boundary(cut) {
                cut -= 1;
            }
            reply.text.truncate(cut);
            reply.text.push_str("\n[answer cut at the size limit]");
        }
        crate::tool_loop::cap_tool_calls(&mut reply.tool_calls);
        events.push(self.run.event(EventData::ModelResponse(ModelResponse {
            provider: reply.provider.clone(),
            model: reply.model.clone(),
            request_hash: request.hash(),
            call: self.call,
            text: reply.text.clone(),
            tool_calls: reply.tool_calls.clone(),
            usage: reply.usage,
            cost_usd: reply.cost_usd,
        })));
        let call = self.call;
        self.call += 1;
        self.call_index += 1;
        self.cost_usd += reply.cost_usd;
        self.tokens += reply.usage.total();
        if let Some(stop_reason) = reply.stop_reason.clone() {
            events.push(self.run.event(EventData::ModelStopped(ModelStopped {
                call,
                stop_reason: stop_reason.clone(),
            })));
            // An answer cut at the output limit is never a success, whatever it parses as:
            // the attempt fails with that reason (and is retried or escalated as any).
            if stop_reason == STOP_MAX_TOKENS {
                return Err(Stop::Failed(format!(
                    "the answer of call {call} was cut at the output limit of {} tokens (stop reason `{STOP_MAX_TOKENS}`); raise the level's `max_tokens` or ask for a shorter answer",
                    request.max_tokens
                )));
            }
        }
        Ok(reply)
    }
}

/// The verifiers that failed and count (those not set to `on_fail: ignore`).
fn failures<'a>(
    specs: &'a [VerifierSpec],
    outcomes: &'a [VerifierFinished],
) -> Vec<(&'a VerifierSpec, &'a VerifierFinished)> {
    specs
        .iter()
        .zip(outcomes)
        .filter(|(spec, o)| !o.passed && spec.on_fail != OnFail::Ignore && !lost_race(o))
        .collect()
}

/// What is wrong with a JSON answer: not JSON at all, or its schema's violations.
fn json_problems(parsed: Option<&Value>, schema: Option<&JsonSchema>) -> Vec<String> {
    match (parsed, schema) {
        (None, _) => vec!["the answer is not valid JSON".to_owned()],
        (Some(value), Some(schema)) => schema.violations(value),
        (Some(_), None) => Vec::new(),
    }
}

fn feedback_text(failed: &[(&VerifierSpec, &VerifierFinished)]) -> String {
    let mut out = String::new();
    for (spec, outcome) in failed {
        out.push_str(&format!(
            "- {} ({}): {}\n",
            spec.name,
            spec.uses.as_str(),
            outcome.reasons.join("; ")
        ));
        // The program's complaint: its stderr, or its stdout when it wrote nothing else
        // (compilers such as Python's compileall report errors there).
        let output = |key: &str| {
            outcome.details.get(key).and_then(Value::as_str).filter(|t| !t.trim().is_empty())
        };
        let complaint = output("stderr_tail")
            .map(|t| ("stderr", t))
            .or_else(|| output("stdout_tail").map(|t| ("stdout", t)));
        if let Some((stream, tail)) = complaint {
            out.push_str(&format!(
                "  {stream} (tail):\n{}\n",
                verifier::tail(tail, limits::FEEDBACK_TAIL_BYTES)
            ));
        }
    }
    out
}

/// Runs a level's verifiers in its mode; outcomes come back in declared order.
async fn run_verifiers(
    run: &LevelRun,
    calls: &mut Calls<'_>,
    specs: &[VerifierSpec],
    mode: Mode,
    run_all: bool,
    ctx: &VerifyContext,
    events: &mut Vec<NewEvent>,
) -> Vec<VerifierFinished> {
    let mut outcomes = Vec::with_capacity(specs.len());
    for spec in specs {
        events.push(run.event(EventData::VerifierStarted(VerifierStarted {
            name: spec.name.clone(),
            uses: spec.uses.as_str().to_owned(),
        })));
    }
    match mode {
        Mode::Serial => {
            let mut stopped = false;
            for spec in specs {
                let outcome = if stopped {
                    verifier::unavailable(spec, "not run: an earlier verifier failed (serial mode)")
                } else if spec.uses == Uses::LlmJudge {
                    judge(calls, spec, ctx, events).await
                } else {
                    verify_one(run, spec, ctx, &run.cancel).await
                };
                if !outcome.passed && !run_all && spec.on_fail != OnFail::Ignore {
                    stopped = true;
                }
                outcomes.push(outcome);
            }
        }
        Mode::Parallel | Mode::Race => {
            // Judges are model calls recorded in this step's events: they run one after
            // another, in declared order; the other verifiers run all at once.
            let others: Vec<&VerifierSpec> =
                specs.iter().filter(|s| s.uses != Uses::LlmJudge).collect();
            let mut done = if mode == Mode::Race {
                race(run, &others, ctx).await.into_iter()
            } else {
                let futures: Vec<_> =
                    others.iter().map(|spec| verify_one(run, spec, ctx, &run.cancel)).collect();
                join_limited(futures, others.len()).await.into_iter()
            };
            let mut slots = Vec::with_capacity(specs.len());
            for spec in specs {
                if spec.uses == Uses::LlmJudge {
                    slots.push(judge(calls, spec, ctx, events).await);
                } else {
                    slots.push(done.next().unwrap_or_else(|| {
                        verifier::unavailable(spec, "the verifier did not run")
                    }));
                }
            }
            outcomes = slots;
        }
    }
    // What a verifier saw is outside text (a program's output, an MCP result): secrets
    // go before it is recorded or fed back to a model.
    for outcome in &mut outcomes {
        run.runtime.redactor.redact_outcome(outcome);
        events.push(run.event(EventData::VerifierFinished(outcome.clone())));
    }
    outcomes
}

/// Runs verifiers at once until the first conclusive outcome (a check that ran, passed or
/// not); the others are cancelled then (their processes killed) and reported as not
/// needed. A cancel of the step cancels them all.
async fn race(
    run: &LevelRun,
    specs: &[&VerifierSpec],
    ctx: &VerifyContext,
) -> Vec<VerifierFinished> {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    let race = CancelToken::new();
    let mut pending: Vec<Option<Pin<Box<dyn Future<Output = VerifierFinished> + Send + '_>>>> =
        specs.iter().map(|spec| Some(Box::pin(verify_one(run, spec, ctx, &race)) as _)).collect();
    let mut results: Vec<Option<VerifierFinished>> = vec![None; specs.len()];
    let mut winner: Option<usize> = None;
    let outer = run.cancel.cancelled();
    tokio::pin!(outer);
    let mut outer_done = false;
    std::future::poll_fn(|cx| {
        if !outer_done && outer.as_mut().poll(cx).is_ready() {
            outer_done = true;
            race.cancel();
        }
        for (i, slot) in pending.iter_mut().enumerate() {
            let Some(future) = slot else { continue };
            if let Poll::Ready(outcome) = future.as_mut().poll(cx) {
                *slot = None;
                if winner.is_none() && !race.is_cancelled() && outcome.score.is_some() {
                    winner = Some(i);
                    race.cancel();
                }
                results[i] = Some(outcome);
            }
        }
        if pending.iter().all(Option::is_none) { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    let cut_short = winner.is_some() || run.cancel.is_cancelled();
    specs
        .iter()
        .zip(results)
        .enumerate()
        .map(|(i, (spec, outcome))| match (outcome, winner) {
            (Some(o), Some(w)) if i != w && o.score.is_none() && cut_short => {
                let by = &specs[w].name;
                let mut lost = verifier::unavailable(
                    spec,
                    &format!("not needed: `{by}` settled the race first"),
                );
                lost.details = json!({"race_lost_to": by});
                lost
            }
            (Some(o), _) => o,
            (None, _) => verifier::unavailable(spec, "the verifier did not run"),
        })
        .collect()
}

/// Whether an outcome is a race's loser, cancelled once another verifier settled it.
fn lost_race(outcome: &VerifierFinished) -> bool {
    outcome.details.get("race_lost_to").is_some()
}

/// An `llm_judge`: one model call, recorded in the step's events, that scores the level's
/// output against each criterion of a rubric; the score is their weighted mean.
async fn judge(
    calls: &mut Calls<'_>,
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    events: &mut Vec<NewEvent>,
) -> VerifierFinished {
    let started = Instant::now();
    let Some(rubric) = &spec.rubric else {
        return verifier::unavailable(spec, "the judge has no rubric");
    };
    let mut prompt = format!(
        "You are a strict reviewer. Score the work below against each criterion, from 0.0 (not met) to 1.0 (fully met).\n\n{}\n\nCriteria:\n",
        rubric.body
    );
    for c in &rubric.criteria {
        prompt.push_str(&format!("- {} (weight {}): {}\n", c.id, c.weight, c.description));
    }
    prompt.push_str(&format!(
        "\nThe work:\n{}\n\nAnswer with only a JSON object: {{\"scores\": {{\"<criterion>\": <0.0 to 1.0>}}, \"reasons\": {{\"<criterion>\": \"<one sentence>\"}}}}",
        ctx.output
    ));
    let spent = calls.cost_usd;
    let answer = match calls.call(events, &format!("judge:{}", rubric.id), &prompt, true).await {
        Ok(text) => text,
        Err(Stop::Failed(message)) => {
            return verifier::unavailable(
                spec,
                &format!("the judge's model call failed: {message}"),
            );
        }
        // An outage says nothing about the work: the level is interrupted, not failed.
        Err(Stop::Interrupted(message)) => {
            let mut outcome = verifier::unavailable(
                spec,
                &format!("every model the judge may use is unavailable: {message}"),
            );
            outcome.details = json!({ INTERRUPTED_KEY: message });
            return outcome;
        }
        Err(Stop::Halted) => {
            return verifier::unavailable(
                spec,
                "the judge was not called: the budget or a cancel stopped the level",
            );
        }
    };
    let cost_usd = calls.cost_usd - spent;
    let duration_ms = elapsed_ms(started);
    let parsed = verdict::parse_json(&answer);
    let Some(scores) =
        parsed.as_ref().and_then(|v| v.get("scores").cloned()).filter(Value::is_object)
    else {
        let mut failed =
            verifier::unavailable(spec, "the judge did not answer with {\"scores\": {…}}");
        failed.cost_usd = cost_usd;
        failed.duration_ms = duration_ms;
        return failed;
    };
    let reasons_given =
        parsed.as_ref().and_then(|v| v.get("reasons").cloned()).unwrap_or(Value::Null);
    let threshold =
        spec.params.get("threshold").and_then(Value::as_f64).unwrap_or(rubric.pass_threshold);
    let (mut weighted, mut weights) = (0.0, 0.0);
    let mut reasons = Vec::new();
    let mut per_criterion = Map::new();
    for c in &rubric.criteria {
        let score = scores.get(&c.id).and_then(Value::as_f64).map_or(0.0, |s| s.clamp(0.0, 1.0));
        weighted += c.weight * score;
        weights += c.weight;
        per_criterion.insert(c.id.clone(), json!(score));
        if score < threshold {
            let why = reasons_given.get(&c.id).and_then(Value::as_str).unwrap_or(
                if scores.get(&c.id).is_none() { "not scored" } else { "no reason given" },
            );
            reasons.push(format!("{} {score:.2}: {why}", c.id));
        }
    }
    let score = if weights > 0.0 { weighted / weights } else { 0.0 };
    let passed = score >= threshold;
    VerifierFinished {
        name: spec.name.clone(),
        passed,
        score: Some(score),
        reasons: if passed { Vec::new() } else { reasons },
        cost_usd,
        duration_ms,
        details: json!({"rubric": rubric.id, "threshold": threshold, "scores": per_criterion}),
    }
}

async fn verify_one(
    run: &LevelRun,
    spec: &VerifierSpec,
    ctx: &VerifyContext,
    cancel: &CancelToken,
) -> VerifierFinished {
    let mut finished = match run.runtime.verifiers.get(spec.uses) {
        Some(v) => v.verify(spec, ctx, cancel).await,
        None => verifier::unavailable(
            spec,
            &format!("the `{}` verifier is not available in this build", spec.uses.as_str()),
        ),
    };
    // A program that ran unconfined (`--no-jail`) says so on its outcome.
    if ctx.jail.is_off() && verifier::runs_programs(spec.uses) {
        if finished.details.is_null() {
            finished.details = Value::Object(serde_json::Map::new());
        }
        if let Value::Object(details) = &mut finished.details {
            details.insert("jail".to_owned(), Value::from("off"));
        }
    }
    finished
}
