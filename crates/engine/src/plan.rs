//! The planner: `plan(&Scenario, &RunState) -> Step`, pure.
//!
//! Given the same scenario and the same events, the planner always returns the same step,
//! on any machine, on replay. It reads no clock and no random source. Transitions that
//! need nothing from the world (gate decisions, level starts, budget aborts, the end of
//! the run) are returned as events to append; only the work of a level is returned as
//! [`Step::Run`], for a runner to perform.

use baton_scenario::Scenario;
use baton_scenario::model::{END, FAIL, LevelIdx, Target};
use serde_json::{Map, Value, json};

use crate::event::{
    ApprovalDecided, BudgetCaps, BudgetExceeded, EventData, FinalStatus, GateDecision,
    LevelFinished, LevelStarted, LevelTimedOut, NewEvent, Reading, RunResumed, ScenarioFinished,
    Totals, Warning,
};
use crate::fan_in::{self, ChildState};
use crate::gate_ctx::GateContext;
use crate::state::{Next, RunState, Status};

/// What the executor does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Append these events; nothing outside the log changes.
    Append(Vec<NewEvent>),
    /// Run an attempt of a level through its kind's runner.
    Run { level: LevelIdx, attempt: u32 },
    /// Wait for a person: an approval decision or an answer.
    Pause,
    /// The run has ended (or never started); nothing to do.
    Done,
}

/// The next step of a run.
pub fn plan(scenario: &Scenario, state: &RunState) -> Step {
    if state.finished.is_some() || state.status == Status::New {
        return Step::Done;
    }
    if state.cancel_requested.is_some() {
        return Step::Append(cancelled(state));
    }
    // A driver that plans an interrupted run continues it: the interrupted attempt runs
    // again (the driver that was interrupted stopped without planning).
    if let Some(interrupted) = &state.interrupted {
        return Step::Append(vec![NewEvent::run(EventData::RunResumed(RunResumed {
            after: interrupted.reason.clone(),
            resumes: state.resumes + 1,
        }))]);
    }
    if state.aborted_reason.is_some() {
        return finish(state, FinalStatus::Aborted, state.aborted_reason.clone());
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
            finish(state, FinalStatus::Aborted, Some("level_run_limit".to_owned()))
        }
        None if state.level_runs == 0 => start(scenario, state, scenario.entry),
        None => finish(state, FinalStatus::Failed, Some("no_route".to_owned())),
        Some(Next::End) => finish(state, FinalStatus::Completed, None),
        Some(Next::Fail(from)) => {
            finish(state, FinalStatus::Failed, Some(format!("routed_to_fail:{from}")))
        }
        Some(Next::Level(id)) => match scenario.level_index(id) {
            Some(i) => start(scenario, state, i),
            None => finish(state, FinalStatus::Failed, Some(format!("unknown_level:{id}"))),
        },
    }
}

fn start(scenario: &Scenario, state: &RunState, index: LevelIdx) -> Step {
    let level = &scenario.levels[index];
    let attempt = state.level(&level.id).map_or(0, |l| l.attempts) + 1;
    Step::Append(vec![NewEvent::level(
        &level.id,
        attempt,
        EventData::LevelStarted(LevelStarted {
            role: level.role.clone(),
            kind: level.kind_name().to_owned(),
            parent: None,
        }),
    )])
}

fn in_flight(scenario: &Scenario, state: &RunState, id: &str) -> Step {
    let Some(index) = scenario.level_index(id) else {
        return finish(state, FinalStatus::Failed, Some(format!("unknown_level:{id}")));
    };
    let attempt = state.level(id).map_or(1, |l| l.attempts);
    // A decision in the log finishes its approval level without any effect; a fan-out's
    // approval children finish one by one, in the order they asked.
    if let Some((pending, decision)) = state
        .pending_approvals
        .iter()
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
            EventData::LevelFinished(decided(&pending.level_id, decision, terminal)),
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
        return Step::Pause;
    }
    if let Some(finished) = fan_in_after_decisions(scenario, index, &children) {
        return Step::Append(vec![NewEvent::level(
            id,
            attempt,
            EventData::LevelFinished(finished),
        )]);
    }
    Step::Run { level: index, attempt }
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
    if let Some(error) = state.level(source).and_then(|l| l.error.clone()) {
        return finish(state, FinalStatus::Failed, Some(error));
    }
    let ctx = GateContext::new(state, source);
    let mut edges = scenario.edges_from(index).peekable();
    if edges.peek().is_none() {
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
            return decision(source, target, expression, readings, false, None);
        }
    }
    let warning = format!("no edge from `{source}` matched; the run falls through to the end");
    decision(source, END, None, Vec::new(), true, Some(warning))
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
    end(state, FinalStatus::Cancelled, Some("cancelled_by_user".to_owned()))
}

fn finish(state: &RunState, status: FinalStatus, reason: Option<String>) -> Step {
    Step::Append(end(state, status, reason))
}

/// The events that end a run: its in-flight level closed as skipped, then the end.
fn end(state: &RunState, status: FinalStatus, reason: Option<String>) -> Vec<NewEvent> {
    let mut events = Vec::new();
    // A level cut short by a cancel or an abort is closed as skipped, so the log says so.
    if let Some(id) = &state.in_flight {
        let attempt = state.level(id).map_or(1, |l| l.attempts);
        events.push(NewEvent::level(id, attempt, EventData::LevelFinished(skipped())));
    }
    let final_output = match status {
        FinalStatus::Completed => state.final_output.clone().or_else(|| last_output(state)),
        _ => state.final_output.clone(),
    };
    events.push(NewEvent::run(EventData::ScenarioFinished(ScenarioFinished {
        status,
        aborted_reason: reason,
        totals: state.totals,
        checksum: state.checksum.clone(),
        final_output,
    })));
    events
}

/// Without a terminal level, the run's output is that of the last level that produced one.
fn last_output(state: &RunState) -> Option<String> {
    state.last_output.clone()
}

fn skipped() -> LevelFinished {
    LevelFinished {
        ok: true,
        skipped: true,
        verdict: None,
        output: String::new(),
        parsed: None,
        confidence: None,
        scratchpad: serde_json::Map::new(),
        conflict: None,
        error: None,
        cost_usd: 0.0,
        tokens: 0,
        duration_ms: 0,
        terminal: false,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}
