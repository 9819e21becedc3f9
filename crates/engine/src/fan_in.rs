//! A fan-out's fan-in: its children's results folded into the fan-out's own result, pure.
//! What an aggregator decides is the scenario language's (`FanIn::decide`); this reads the
//! children from the state and writes the decision as the fan-out's `level_finished`.
//!
//! The runner uses it when its step ends with every child settled; the planner uses it
//! when some children were `human_approval` levels and the last of them has been decided,
//! reading the children's results from the state. Both give the same event. Both read
//! where each child stands in the fan-out's current attempt with [`children_in_attempt`]:
//! the children that finished in an earlier, interrupted step of that attempt are kept.

use baton_scenario::Scenario;
use baton_scenario::model::{Level, LevelIdx, LevelKind};
use serde_json::{Map, Value, json};

use crate::event::LevelFinished;
use crate::state::RunState;

/// Where one child of a fan-out stands in the fan-out's current attempt, as the log says.
#[derive(Clone, Debug, PartialEq)]
pub enum ChildState<'a> {
    /// Not started since the fan-out's current attempt started.
    NotStarted,
    /// Started and not finished: waiting for a person, or stopped by the budget.
    Unsettled,
    Finished(ChildResult<'a>),
}

/// Every child of the fan-out at `index`, in declared order, with where it stands in the
/// fan-out's current attempt: a child counts when it started after the fan-out did (its
/// `started_seq` is later). Empty when the level is no fan-out or has not started.
pub fn children_in_attempt<'a>(
    scenario: &'a Scenario,
    state: &'a RunState,
    index: LevelIdx,
) -> Vec<(LevelIdx, ChildState<'a>)> {
    let level = &scenario.levels[index];
    let LevelKind::FanOut { children, .. } = &level.kind else { return Vec::new() };
    let Some(since) = state.level(&level.id).map(|l| l.started_seq) else { return Vec::new() };
    children
        .iter()
        .map(|&child| {
            let id = scenario.levels[child].id.as_str();
            let child_state = match state.level(id).filter(|l| l.started_seq > since) {
                None => ChildState::NotStarted,
                Some(l) if l.running => ChildState::Unsettled,
                Some(l) => ChildState::Finished(ChildResult {
                    id,
                    ok: l.ok.unwrap_or(false),
                    verdict: l.verdict.as_deref(),
                    error: l.error.as_deref(),
                    error_kind: l.error_kind,
                    cost_usd: l.attempt_cost_usd,
                    tokens: l.attempt_tokens,
                }),
            };
            (child, child_state)
        })
        .collect()
}

/// What the fan-in reads of one child's finished attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildResult<'a> {
    pub id: &'a str,
    pub ok: bool,
    pub verdict: Option<&'a str>,
    pub error: Option<&'a str>,
    pub error_kind: Option<crate::event::ErrorKind>,
    pub cost_usd: f64,
    pub tokens: u64,
}

impl ChildResult<'_> {
    fn passed(&self) -> bool {
        self.ok && self.verdict.is_none_or(|v| v == "PASS")
    }
}

/// The fan-out `level`'s result from its `count` children's, those that finished given in
/// declared order (a child without a result counts as not passed). A child that failed (an
/// error, not a FAIL verdict) fails the fan-out.
pub fn aggregate(
    level: &Level,
    children: &[ChildResult<'_>],
    count: usize,
    duration_ms: u64,
) -> LevelFinished {
    let LevelKind::FanOut { fan_in, .. } = &level.kind else {
        return LevelFinished::failed(
            format!("level `{}` is not a fan-out", level.id),
            duration_ms,
        );
    };
    // The first child that failed with an error fails the fan-out the same way.
    if let Some(child) = children.iter().find(|c| c.error.is_some()) {
        let message =
            format!("fan-out child `{}` failed: {}", child.id, child.error.unwrap_or_default());
        return LevelFinished {
            error_kind: child.error_kind,
            ..LevelFinished::failed(message, duration_ms)
        };
    }
    let cost: f64 = children.iter().map(|c| c.cost_usd).sum();
    let tokens: u64 = children.iter().map(|c| c.tokens).sum();
    let results: Vec<(&str, bool)> = children.iter().map(|c| (c.id, c.passed())).collect();
    let decided = fan_in.decide(&results, count);
    let verdicts: Map<String, Value> = results
        .iter()
        .map(|&(id, pass)| (id.to_owned(), Value::from(if pass { "PASS" } else { "FAIL" })))
        .collect();
    let (pass, passed, score, n) = (decided.pass, decided.passed, decided.score, count);
    let verdict = if pass { "PASS" } else { "FAIL" };
    let aggregator = fan_in.aggregator.as_str();
    LevelFinished {
        ok: true,
        skipped: false,
        verdict: Some(verdict.to_owned()),
        output: format!("{passed} of {n} children passed ({aggregator}): {verdict}"),
        parsed: Some(json!({"children": verdicts, "score": score, "aggregator": aggregator})),
        confidence: None,
        scratchpad: Map::new(),
        conflict: (!pass).then(|| level.id.clone()),
        error: None,
        error_kind: None,
        cost_usd: cost,
        tokens,
        duration_ms,
        terminal: level.terminal,
        touched_paths: Vec::new(),
        snapshot: None,
    }
}
