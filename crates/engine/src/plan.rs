//! The planner: `plan(&Scenario, &RunState) -> Step`, pure.
//!
//! Given the same scenario and the same events, the planner always returns the same step,
//! on any machine, on replay. It reads no clock and no random source. Transitions that
//! need nothing from the world (gate decisions, level starts, budget aborts, the end of
//! the run) are returned as events to append; only the work of a level is returned as
//! [`Step::Run`], for a runner to perform.

use baton_scenario::Scenario;
use baton_scenario::limits::WAVE_PARALLEL_MAX;
use baton_scenario::model::{END, FAIL, LevelIdx, LevelKind, Target, WaveDispatch, WaveSpec};
use serde_json::{Map, Value, json};

use crate::event::{
    AgentHandoff, ApprovalDecided, BudgetCaps, BudgetExceeded, ChildRunSettled, EventData,
    FinalStatus, GateDecision, LevelFinished, LevelStarted, LevelTimedOut, NewEvent,
    PAUSE_APPROVAL, PAUSE_DRIVER_LOST, PAUSE_QUESTION, RESUMED_BY_DRIVER, RESUMED_BY_TAKEOVER,
    Reading, RetryAttempted, RunPaused, RunResumed, RunTakenOver, ScenarioFinished, Totals,
    Warning, WaveDecided, WaveDecision,
};
use crate::fan_in::{self, ChildState};
use crate::gate_ctx::GateContext;
use crate::limits::{CHAIN_DEPTH_MAX, CHAIN_LINK};
use crate::state::PendingApproval;
use crate::state::{LevelState, Next, RunState, Status};

/// What the executor does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Append these events; nothing outside the log changes.
    Append(Vec<NewEvent>),
    /// Run an attempt of a level through its kind's runner.
    Run { level: LevelIdx, attempt: u32 },
    /// Wait for a person: an approval decision or an answer.
    Pause,
    /// The run's result names an intent route (`route`, from `level_id`'s output; empty
    /// when none was usable): the executor resolves it to a scenario and starts that
    /// scenario as a child run (`scenario_chained`, `child_run_started`). `reason` says why
    /// a job without a usable route goes to the fallback.
    Chain { level_id: String, route: String, reason: Option<String> },
    /// The run waits for its open child runs; with `stop`, the run is ending (a cancel) and
    /// they are cancelled first and waited for up to the settle timeout.
    Children { stop: bool },
    /// A wave level is under way: the executor settles the workers that ended, dispatches
    /// what [`crate::wave::WaveState::admissible`] admits under the parallelism in force,
    /// and the run waits for its workers (or, for a manual wave, for outside agents).
    Wave { level: LevelIdx },
    /// The run has ended (or never started); nothing to do.
    Done,
}

/// The next step of a run.
pub fn plan(scenario: &Scenario, state: &RunState) -> Step {
    if state.finished.is_some() || state.status == Status::New {
        return Step::Done;
    }
    let open_children = state.open_children().next().is_some();
    if state.cancel_requested.is_some() {
        if open_children {
            return Step::Children { stop: true };
        }
        return Step::Append(cancelled(state));
    }
    if open_children && !(wave_in_flight(scenario, state) && state.aborted_reason.is_none()) {
        return Step::Children { stop: false };
    }
    // A chained job ends as the run it chained to ended.
    if let Some(settled) = chained_result(state) {
        return Step::Append(end_as(state, settled));
    }
    // A driver that plans an interrupted run continues it: the interrupted attempt runs
    // again (the driver that was interrupted stopped without planning).
    if let Some(interrupted) = &state.interrupted {
        return Step::Append(vec![NewEvent::run(EventData::RunResumed(RunResumed {
            after: interrupted.reason.clone(),
            resumes: state.resumes + 1,
            by: Some(RESUMED_BY_DRIVER.to_owned()),
            process: None,
        }))]);
    }
    // A run that waited for a person goes on once nobody is waited for: the decision that
    // ended the wait is in the log; the resumption is recorded before anything it lets
    // happen.
    if let Some(paused) = &state.paused
        && !state.awaiting_person()
    {
        return Step::Append(vec![NewEvent::run(EventData::RunResumed(RunResumed {
            after: paused.reason.clone(),
            resumes: state.resumes + 1,
            by: state.last_decider.clone(),
            process: None,
        }))]);
    }
    if state.aborted_reason.is_some() {
        return end_or_chain(state, FinalStatus::Aborted, state.aborted_reason.clone());
    }
    if let Some(exceeded) = over_budget(state) {
        return Step::Append(vec![NewEvent::run(EventData::BudgetExceeded(exceeded))]);
    }
    if let Some(id) = &state.in_flight {
        return in_flight(scenario, state, id);
    }
    if let Some(source) = &state.route_pending {
        return route(scenario, state, source);
    }
    // The limit bounds the levels started: a run whose last allowed level routes to the
    // end completes.
    let over_limit = state.level_runs >= state.budget.level_runs_max();
    match &state.next {
        Some(Next::Level(_)) if over_limit => {
            end_or_chain(state, FinalStatus::Aborted, Some("level_run_limit".to_owned()))
        }
        None if state.level_runs == 0 => start(scenario, state, scenario.entry),
        None => end_or_chain(state, FinalStatus::Failed, Some("no_route".to_owned())),
        Some(Next::End) => end_or_chain(state, FinalStatus::Completed, None),
        Some(Next::Fail(from)) => {
            end_or_chain(state, FinalStatus::Failed, Some(format!("routed_to_fail:{from}")))
        }
        Some(Next::Level(id)) => match scenario.level_index(id) {
            Some(i) => start(scenario, state, i),
            None => finish(state, FinalStatus::Failed, Some(format!("unknown_level:{id}"))),
        },
    }
}

/// The end of a run, or the chain its result asks for (002): a run that completes with a
/// level's output naming `chosen_intent_route` goes on in the scenario that owns the
/// route; a job routed by the classifier that ends without a usable route goes on in the
/// fallback scenario, so the user still gets an answer. Past [`CHAIN_DEPTH_MAX`] hops the
/// run ends aborted instead (`chain_depth_limit`), never looping.
fn end_or_chain(state: &RunState, status: FinalStatus, reason: Option<String>) -> Step {
    if state.chained.is_some() {
        return finish(state, status, reason);
    }
    let classifier_job = state.selected.as_ref().is_some_and(|s| s.how == "classifier");
    let chain = match (&state.chosen_route, status) {
        (Some((level, route)), FinalStatus::Completed) => {
            let why = route.is_empty().then(|| {
                format!("level `{level}` named no intent route (`chosen_intent_route` is empty or not a string)")
            });
            Some((level.clone(), route.clone(), why))
        }
        _ if classifier_job => {
            let why = format!(
                "the classifier ended {} without a usable route{}",
                status.as_str(),
                reason.as_ref().map_or(String::new(), |r| format!(" ({r})"))
            );
            Some((String::new(), String::new(), Some(why)))
        }
        _ => None,
    };
    let Some((level_id, route, why)) = chain else {
        return finish(state, status, reason);
    };
    if state.depth() + 1 > CHAIN_DEPTH_MAX {
        let route: String = route.chars().take(crate::limits::ROUTE_CHARS_MAX).collect();
        let reason = format!(
            "chain_depth_limit: the result of level `{level_id}` chains to route `{route}`, one hop past the limit of {CHAIN_DEPTH_MAX} (this run is hop {})",
            state.depth()
        );
        let mut events =
            vec![NewEvent::run(EventData::Warning(Warning { message: reason.clone() }))];
        events.extend(end(state, FinalStatus::Aborted, Some(reason)));
        return Step::Append(events);
    }
    Step::Chain { level_id, route, reason: why }
}

/// The result of the run a job chained to, once settled.
fn chained_result(state: &RunState) -> Option<&ChildRunSettled> {
    state.chained.as_ref()?;
    state.children.iter().rev().find(|c| c.started.link == CHAIN_LINK)?.settled.as_ref()
}

/// The end of a chained job: the status and output of the run it chained to.
fn end_as(state: &RunState, settled: &ChildRunSettled) -> Vec<NewEvent> {
    let mut events = end(state, settled.status, settled.aborted_reason.clone());
    if let Some(NewEvent { data: EventData::ScenarioFinished(f), .. }) = events.last_mut() {
        f.final_output.clone_from(&settled.final_output);
    }
    events
}

fn start(scenario: &Scenario, state: &RunState, index: LevelIdx) -> Step {
    let level = &scenario.levels[index];
    let attempt = state.level(&level.id).map_or(0, |l| l.attempts) + 1;
    let mut events = vec![NewEvent::level(
        &level.id,
        attempt,
        EventData::LevelStarted(LevelStarted {
            role: level.role.clone(),
            kind: level.kind_name().to_owned(),
            parent: None,
            model_constraint_allow: Some(constraint_allow(level)),
            process: None,
        }),
    )];
    // A retry (the level entered again from itself) is the same role's work going on.
    if level.handoff && state.last_level.as_deref() != Some(level.id.as_str()) {
        let from_role = match state.last_level.as_deref().and_then(|id| scenario.level(id)) {
            Some(previous) => previous.role.clone(),
            None => "user".to_owned(),
        };
        events.push(NewEvent::level(
            &level.id,
            attempt,
            EventData::AgentHandoff(AgentHandoff {
                from_role,
                to_role: level.role.clone(),
                level_id: level.id.clone(),
                attempt,
            }),
        ));
    }
    Step::Append(events)
}

/// The `model.allow` a level runs under, as `level_started` records it.
pub fn constraint_allow(level: &baton_scenario::Level) -> Vec<String> {
    level.model.as_ref().map(|m| m.allow.clone()).unwrap_or_default()
}

/// Whether the driver of a run was lost without a word: a level of its own is in flight
/// (not a wave, which waits for its workers between drives) while nothing else explains
/// why nobody drives it — no interruption, pause, wait for a person or child, cancel or
/// end. The process that drives it next records [`taken_over`].
pub fn driver_lost(scenario: &Scenario, state: &RunState) -> bool {
    let Some(id) = &state.in_flight else { return false };
    let wave = scenario.level(id).is_some_and(|l| matches!(l.kind, LevelKind::Wave(_)));
    state.status == Status::Running
        && !wave
        && state.interrupted.is_none()
        && state.paused.is_none()
        && state.cancel_requested.is_none()
        && !state.awaiting_person()
        && state.open_children().next().is_none()
}

/// The pause of a run whose driver was lost, the takeover (who held it, who takes it, the
/// calls it sent and never saw answered, charged at their worst case), and the run's
/// resumption by `process`.
pub fn taken_over(state: &RunState, process: &str) -> Vec<NewEvent> {
    let level = state.in_flight.as_deref().unwrap_or_default();
    let attempt = state.levels.get(level).map_or(0, |l| l.attempts);
    let cut = state.unanswered.clone();
    let charged_usd = cut.iter().filter_map(|c| c.worst_case_usd).sum();
    vec![
        NewEvent::run(EventData::RunPaused(RunPaused {
            reason: PAUSE_DRIVER_LOST.to_owned(),
            detail: Some(format!("the driver stopped without a word while level {level} ran")),
        })),
        // On the level, whose spend the charge is.
        NewEvent::level(
            level,
            attempt,
            EventData::RunTakenOver(RunTakenOver {
                previous: state.driver.clone(),
                by: process.to_owned(),
                level_id: level.to_owned(),
                attempt,
                cut,
                charged_usd,
                restarts_from: state
                    .workspace
                    .as_ref()
                    .map(|w| state.workspace_head.clone().unwrap_or_else(|| w.base.clone())),
            }),
        ),
        NewEvent::run(EventData::RunResumed(RunResumed {
            after: PAUSE_DRIVER_LOST.to_owned(),
            resumes: state.resumes + 1,
            by: Some(RESUMED_BY_TAKEOVER.to_owned()),
            process: Some(process.to_owned()),
        })),
    ]
}

/// Names `process` as the run's driver where it changes, in the events a drive is about
/// to stage: on a resumption, and on the first level it starts of a run whose log names
/// another driver (what a takeover names as the lost one).
pub fn name_driver(events: &mut [NewEvent], state: &RunState, process: &str) {
    let mut named = state.driver.as_deref() == Some(process);
    for event in events {
        match &mut event.data {
            EventData::RunResumed(r) => {
                r.process = Some(process.to_owned());
                named = true;
            }
            EventData::LevelStarted(l) if !named => {
                l.process = Some(process.to_owned());
                named = true;
            }
            _ => {}
        }
    }
}

/// A run that waits for a person: the pause is recorded once (`run_paused`, with what it
/// waits for), then the driver stops.
fn pause(state: &RunState) -> Step {
    if state.paused.is_some() {
        return Step::Pause;
    }
    let (reason, detail) = match state.open_approvals().next() {
        Some(p) => (
            PAUSE_APPROVAL,
            format!(
                "level {} waits for {} to decide request {}",
                p.level_id, p.request.approver_role, p.request.request_id
            ),
        ),
        None => (
            PAUSE_QUESTION,
            format!(
                "waits for an answer to question {}",
                state.pending_ask.as_ref().map_or("", |a| a.call_id.as_str())
            ),
        ),
    };
    Step::Append(vec![NewEvent::run(EventData::RunPaused(RunPaused {
        reason: reason.to_owned(),
        detail: Some(detail),
    }))])
}

fn in_flight(scenario: &Scenario, state: &RunState, id: &str) -> Step {
    let Some(index) = scenario.level_index(id) else {
        return finish(state, FinalStatus::Failed, Some(format!("unknown_level:{id}")));
    };
    let attempt = state.level(id).map_or(1, |l| l.attempts);
    if let LevelKind::Wave(spec) = &scenario.levels[index].kind {
        return wave_step(scenario, state, index, attempt, spec);
    }
    // A decision in the log finishes its approval level without any effect; a fan-out's
    // approval children finish one by one, in the order they asked. A decision on a tool
    // loop's call finishes nothing: the loop runs again and reads it.
    if let Some((pending, decision)) = state
        .pending_approvals
        .iter()
        .filter(|p| p.request.tool.is_none())
        .find_map(|p| state.decisions.get(&p.request.request_id).map(|d| (p, d)))
    {
        let level = scenario.level(&pending.level_id);
        let terminal = level.is_some_and(|l| l.terminal);
        let mut events = Vec::new();
        if decision.timed_out {
            // Nobody decided in time: the level reads `timed_out`, as any level cut at its
            // timeout does.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let timeout_ms = level.and_then(|l| l.timeout_s).map_or(0, |s| (s * 1000.0) as u64);
            events.push(NewEvent::level(
                &pending.level_id,
                pending.attempt,
                EventData::LevelTimedOut(LevelTimedOut { timeout_ms, elapsed_ms: timeout_ms }),
            ));
        }
        events.push(NewEvent::level(
            &pending.level_id,
            pending.attempt,
            EventData::LevelFinished(Box::new(decided(&pending.level_id, decision, terminal))),
        ));
        return Step::Append(events);
    }
    // A fan-out whose step stopped part-way (a crash, a cancel) runs again for the children
    // that have not started in its current attempt; those that finished are kept.
    let children = fan_in::children_in_attempt(scenario, state, index);
    if children.iter().any(|(_, c)| matches!(c, ChildState::NotStarted)) {
        return Step::Run { level: index, attempt };
    }
    if state.awaiting_person() {
        return pause(state);
    }
    if let Some(finished) = fan_in_after_decisions(scenario, index, &children) {
        return Step::Append(vec![NewEvent::level(
            id,
            attempt,
            EventData::LevelFinished(Box::new(finished)),
        )]);
    }
    Step::Run { level: index, attempt }
}

/// Whether the level in flight is a wave.
fn wave_in_flight(scenario: &Scenario, state: &RunState) -> bool {
    state
        .in_flight
        .as_ref()
        .and_then(|id| scenario.level(id))
        .is_some_and(|l| matches!(l.kind, LevelKind::Wave(_)))
}

/// The next step of a wave level in flight: plan it (or fail it, before any worker, when
/// its plan does not read), end it once its controller decides an end (an outside agent
/// ends a manual wave with `baton wave complete`), else let the executor dispatch and wait.
fn wave_step(
    scenario: &Scenario,
    state: &RunState,
    index: LevelIdx,
    attempt: u32,
    spec: &WaveSpec,
) -> Step {
    let level = &scenario.levels[index];
    let Some(wave) = state.waves.get(&level.id) else {
        let event = match crate::wave_plan::plan(spec, state) {
            Ok(planned) => EventData::WavePlanned(planned),
            Err(error) => EventData::LevelFinished(Box::new(LevelFinished {
                ok: false,
                error: Some(format!("wave_plan: {error}")),
                ..skipped_with(false)
            })),
        };
        return Step::Append(vec![NewEvent::level(&level.id, attempt, event)]);
    };
    if let Some(closed) = &wave.closed {
        return Step::Append(vec![wave_finished(level, attempt, wave, closed.decision)]);
    }
    // Capacity does not enter an end: only a wave with nothing planned or in flight, or
    // one stopped by a bad outcome, ends.
    let decision = wave.decide(false, WAVE_PARALLEL_MAX);
    if decision.is_final() && spec.dispatch == WaveDispatch::Auto {
        let decided = WaveDecided {
            decision,
            counts: wave.counts(),
            max_parallel: 0,
            dispatched: Vec::new(),
            closes: true,
            by: None,
        };
        return Step::Append(vec![
            NewEvent::level(&level.id, attempt, EventData::WaveDecided(decided)),
            wave_finished(level, attempt, wave, decision),
        ]);
    }
    Step::Wave { level: index }
}

/// The end of a wave's attempt: its summary is its output, PASS when it completed.
fn wave_finished(
    level: &baton_scenario::model::Level,
    attempt: u32,
    wave: &crate::wave::WaveState,
    decision: WaveDecision,
) -> NewEvent {
    let summary = wave.summary(decision, false);
    let (cost_usd, tokens) = wave.spent();
    let verdict = if decision == WaveDecision::Complete { "PASS" } else { "FAIL" };
    NewEvent::level(
        &level.id,
        attempt,
        EventData::LevelFinished(Box::new(LevelFinished {
            ok: true,
            verdict: Some(verdict.to_owned()),
            output: summary.to_string(),
            parsed: Some(summary),
            cost_usd,
            tokens,
            terminal: level.terminal,
            ..skipped_with(false)
        })),
    )
}

/// The result of an approval level, from its decision: the decision's fields and the
/// approver's data make the level's parsed output.
fn decided(level_id: &str, decision: &ApprovalDecided, terminal: bool) -> LevelFinished {
    let verdict = if decision.approved { "PASS" } else { "FAIL" };
    let output = decision.comment.clone().unwrap_or_else(|| {
        if decision.approved { "approved".to_owned() } else { "rejected".to_owned() }
    });
    let mut parsed = match &decision.data {
        Some(Value::Object(data)) => data.clone(),
        _ => Map::new(),
    };
    parsed.insert("approved".to_owned(), Value::Bool(decision.approved));
    parsed.insert("comment".to_owned(), json!(decision.comment));
    parsed.insert("by".to_owned(), json!(decision.by));
    if decision.timed_out {
        parsed.insert("timed_out".to_owned(), Value::Bool(true));
    }
    LevelFinished {
        ok: true,
        skipped: false,
        verdict: Some(verdict.to_owned()),
        output,
        parsed: Some(Value::Object(parsed)),
        confidence: None,
        scratchpad: Map::new(),
        conflict: (!decision.approved).then(|| {
            if decision.timed_out {
                format!("timed_out:{level_id}")
            } else {
                format!("human_approval:{level_id}")
            }
        }),
        error: None,
        error_kind: None,
        cost_usd: 0.0,
        tokens: 0,
        duration_ms: 0,
        terminal,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}

/// A fan-out whose step ended with children waiting for decisions is finished here, once
/// every child has finished in its current attempt (`children`, from
/// [`fan_in::children_in_attempt`]).
fn fan_in_after_decisions(
    scenario: &Scenario,
    index: LevelIdx,
    children: &[(LevelIdx, ChildState<'_>)],
) -> Option<LevelFinished> {
    let level = &scenario.levels[index];
    // No fan-out, or one whose step has not run.
    if children.is_empty() {
        return None;
    }
    let mut results = Vec::with_capacity(children.len());
    for (_, child) in children {
        let ChildState::Finished(result) = child else { return None };
        results.push(result.clone());
    }
    // The planner reads no clock: the children's own results carry their durations.
    Some(fan_in::aggregate(level, &results, children.len(), 0))
}

fn route(scenario: &Scenario, state: &RunState, source: &str) -> Step {
    let Some(index) = scenario.level_index(source) else {
        return finish(state, FinalStatus::Failed, Some(format!("unknown_level:{source}")));
    };
    // A level that failed with an error (its model call, its tools) is routed only by the
    // edges whose gates read how it ended (`level.X.failed`, `level.X.error.kind`,
    // `attempt`); when none fires — or the run began before that rule, or the error is of
    // no kind edges route — it ends the run failed, or, for a job the classifier routes,
    // goes on in the fallback with the failure recorded.
    let level = state.level(source);
    let error = level.and_then(|l| l.error.clone());
    if let Some(error) = &error
        && !(state.failures_routed && level.is_some_and(|l| l.error_kind.is_some()))
    {
        return end_or_chain(state, FinalStatus::Failed, Some(error.clone()));
    }
    let ctx = GateContext::new(state, source);
    let mut edges = scenario
        .edges_from(index)
        .filter(|e| error.is_none() || e.when.as_ref().is_some_and(|g| g.reads_outcome_of(source)))
        .peekable();
    if edges.peek().is_none() {
        if let Some(error) = error {
            return end_or_chain(state, FinalStatus::Failed, Some(error));
        }
        // A level without outgoing edges leads to the end.
        return decision(source, END, None, Vec::new(), false, None);
    }
    for edge in edges {
        let (fires, readings, expression) = match &edge.when {
            None => (true, Vec::new(), None),
            Some(gate) => {
                let (fires, readings) = ctx.decide(gate);
                let readings = readings
                    .into_iter()
                    .map(|r| Reading { path: r.path, value: r.value })
                    .collect();
                (fires, readings, Some(gate.to_string()))
            }
        };
        if fires {
            let target = match edge.to {
                Target::Level(t) => scenario.levels[t].id.as_str(),
                Target::End => END,
                Target::Fail => FAIL,
            };
            let mut step = decision(source, target, expression, readings, false, None);
            // A retry the level-run cap stops is not attempted: the abort follows instead.
            // Runs begun before retries were recorded keep the log they had.
            if target == source
                && state.failures_routed
                && state.level_runs < state.budget.level_runs_max()
                && let (Step::Append(events), Some(level)) = (&mut step, level)
            {
                events.push(retry_attempted(source, level));
            }
            return step;
        }
    }
    if let Some(error) = error {
        return end_or_chain(state, FinalStatus::Failed, Some(error));
    }
    let warning = format!("no edge from `{source}` matched; the run falls through to the end");
    decision(source, END, None, Vec::new(), true, Some(warning))
}

/// The record of a gate sending `level` back to itself, with why its last attempt is
/// retried.
fn retry_attempted(source: &str, level: &LevelState) -> NewEvent {
    let reason = match (level.error_kind, &level.error, &level.feedback) {
        (Some(kind), Some(message), _) | (Some(kind), None, Some(message)) => {
            format!("{}: {message}", kind.as_str())
        }
        (Some(kind), None, None) => kind.as_str().to_owned(),
        (None, ..) => match &level.verdict {
            Some(verdict) => format!("verdict {verdict}"),
            None => "the gate sent the level back to itself".to_owned(),
        },
    };
    NewEvent::level(
        source,
        level.attempts,
        EventData::RetryAttempted(RetryAttempted {
            level: source.to_owned(),
            attempt: level.attempts + 1,
            reason,
        }),
    )
}

fn decision(
    source: &str,
    target: &str,
    expression: Option<String>,
    readings: Vec<Reading>,
    fallthrough: bool,
    warning: Option<String>,
) -> Step {
    let mut events = Vec::new();
    if let Some(message) = warning {
        events.push(NewEvent::run(EventData::Warning(Warning { message })));
    }
    events.push(NewEvent::run(EventData::GateDecision(GateDecision {
        source: source.to_owned(),
        target: target.to_owned(),
        expression,
        readings,
        fallthrough,
    })));
    Step::Append(events)
}

/// The first cap the run's totals have crossed, if any.
pub fn over_budget(state: &RunState) -> Option<BudgetExceeded> {
    over_caps(state.budget, state.totals)
}

/// The first cap that `t` crosses, if any.
pub fn over_caps(b: BudgetCaps, t: Totals) -> Option<BudgetExceeded> {
    let exceeded = |kind: &str, limit: f64, observed: f64| BudgetExceeded {
        limit_kind: kind.to_owned(),
        limit_value: limit,
        observed_value: observed,
        refused_before_call: false,
    };
    if let Some(max) = b.max_cost_usd
        && t.cost_usd > max
    {
        return Some(exceeded("cost", max, t.cost_usd));
    }
    #[allow(clippy::cast_precision_loss)]
    if let Some(max) = b.max_tokens
        && t.tokens > max
    {
        return Some(exceeded("tokens", max as f64, t.tokens as f64));
    }
    #[allow(clippy::cast_precision_loss)]
    if let Some(max) = b.max_duration_s {
        let seconds = t.duration_ms as f64 / 1000.0;
        if seconds > max {
            return Some(exceeded("duration", max, seconds));
        }
    }
    None
}

/// The end of a run whose cancel was requested. It reads nothing from the scenario, so a
/// run can be ended after its scenario files changed or went away.
pub fn cancelled(state: &RunState) -> Vec<NewEvent> {
    let mut events = Vec::new();
    // A wave cut by the cancel records its end with what settled.
    if let Some(id) = &state.in_flight
        && let Some(wave) = state.waves.get(id)
        && wave.closed.is_none()
    {
        let decided = WaveDecided {
            decision: WaveDecision::Cancelled,
            counts: wave.counts(),
            max_parallel: 0,
            dispatched: Vec::new(),
            closes: true,
            by: state.cancel_requested.as_ref().and_then(|c| c.by.clone()),
        };
        events.push(NewEvent::level(id, wave.attempt, EventData::WaveDecided(decided)));
    }
    // A result that came after the cancel was dropped: the run ends `aborted`, as the
    // reference names a worker whose success came after its abort.
    let (status, reason) = match &state.late_result {
        Some(_) => (FinalStatus::Aborted, crate::event::LATE_RESULT_AFTER_CANCEL),
        None => (FinalStatus::Cancelled, "cancelled_by_user"),
    };
    events.extend(end(state, status, Some(reason.to_owned())));
    events
}

fn finish(state: &RunState, status: FinalStatus, reason: Option<String>) -> Step {
    Step::Append(end(state, status, reason))
}

/// The events that end a run: its in-flight level closed as skipped, then the end.
pub(crate) fn end(state: &RunState, status: FinalStatus, reason: Option<String>) -> Vec<NewEvent> {
    let mut events = Vec::new();
    // A level cut short by a cancel or an abort is closed as skipped, so the log says so.
    if let Some(id) = &state.in_flight {
        let attempt = state.level(id).map_or(1, |l| l.attempts);
        events.push(NewEvent::level(id, attempt, EventData::LevelFinished(Box::new(skipped()))));
    }
    let final_output = match status {
        FinalStatus::Completed => state.session.final_output.clone().or_else(|| last_output(state)),
        _ => state.session.final_output.clone(),
    };
    events.push(NewEvent::run(EventData::ScenarioFinished(Box::new(ScenarioFinished {
        status,
        aborted_reason: reason,
        totals: state.totals,
        checksum: state.checksum.clone(),
        final_output,
        tree_totals: (!state.children.is_empty()).then(|| state.tree_totals()),
    }))));
    events
}

/// Without a terminal level, the run's output is that of the last level that produced one.
fn last_output(state: &RunState) -> Option<String> {
    state.session.last_output.clone()
}

fn skipped() -> LevelFinished {
    skipped_with(true)
}

/// An empty result, skipped or not.
fn skipped_with(skipped: bool) -> LevelFinished {
    LevelFinished {
        ok: true,
        skipped,
        verdict: None,
        output: String::new(),
        parsed: None,
        confidence: None,
        scratchpad: serde_json::Map::new(),
        conflict: None,
        error: None,
        error_kind: None,
        cost_usd: 0.0,
        tokens: 0,
        duration_ms: 0,
        terminal: false,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}

/// The decision on a request nobody decided before its deadline: a rejection, marked
/// timed out.
pub(crate) fn timed_out(pending: &PendingApproval) -> ApprovalDecided {
    let at = pending.request.deadline.map(|d| d.to_rfc3339()).unwrap_or_default();
    ApprovalDecided {
        request_id: pending.request.request_id.clone(),
        approved: false,
        comment: Some(format!("nobody decided before the deadline ({at})")),
        by: None,
        data: None,
        timed_out: true,
    }
}
